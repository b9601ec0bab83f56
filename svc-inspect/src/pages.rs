//! The server-rendered dashboard: plain HTML with a little CSS, refreshed by a `<meta
//! http-equiv="refresh">`. Pure functions from fleet data to markup; every piece of fleet
//! data goes through [`esc`] (ids, addresses, errors and label values are not ours).

use std::fmt::Write as _;

use crate::fleet::{ClusterIndex, FleetOverview};
use crate::html::{coarse, esc, pct, timestamp};
use crate::view::{
    ClusterNeedsView, ClusterView, DomainView, MACHINE_STATES, NeedRow, Page, ShardFetchView,
    ShortfallView, resources_text, short_state,
};

/// Seconds between automatic reloads of live pages.
pub const REFRESH_SECONDS: u32 = 5;

const STYLE: &str = r#"
:root{--fg:#1d2433;--muted:#5b6476;--line:#d9dee8;--bg:#f6f7fa;--ok:#1a7f37;--bad:#c62828;--warn:#9a6700;--accent:#2f5bd3}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{display:flex;gap:24px;align-items:center;padding:10px 24px;background:#1d2433;color:#fff}
header a{color:#dfe6ff;text-decoration:none;margin-right:14px}
header .brand{font-weight:700;color:#fff;font-size:16px}
header form{margin-left:auto}
header input{padding:4px 8px;border-radius:4px;border:0;width:200px}
header button{padding:4px 10px;border:0;border-radius:4px;background:var(--accent);color:#fff}
main{padding:16px 24px;max-width:1600px}
h1{font-size:20px;margin:4px 0 12px}
h2{font-size:16px;margin:22px 0 8px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#fff;border:1px solid var(--line);border-radius:6px;padding:10px 14px;min-width:130px}
.card .n{font-size:22px;font-weight:600}
.card .l{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;background:#fff;border:1px solid var(--line);width:100%}
.scroll{overflow-x:auto}
td.nowrap{white-space:nowrap}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#eef1f6;font-weight:600;font-size:12px;white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:var(--ok);font-weight:600}
.bad{color:var(--bad);font-weight:600}
.warn{color:var(--warn);font-weight:600}
.muted{color:var(--muted)}
.banner{padding:10px 14px;border-radius:6px;margin:8px 0 14px;background:#fdecea;border:1px solid #f5c2c0;color:#7a1c17}
.note{padding:8px 12px;border-radius:6px;margin:8px 0;background:#fff8e1;border:1px solid #f2dfa4}
.pager{margin:10px 0;display:flex;gap:14px;align-items:center}
.filters a{margin-right:10px}
.filters a.on{font-weight:700;text-decoration:none;color:var(--fg)}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
footer{padding:14px 24px;color:var(--muted);font-size:12px}
"#;

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

struct Doc {
    out: String,
}

impl Doc {
    fn new(title: &str, nav: Nav, refresh: bool) -> Self {
        let mut out = String::with_capacity(16 * 1024);
        out.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
        out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
        if refresh {
            let _ = write!(
                out,
                "<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">"
            );
        }
        let _ = write!(
            out,
            "<title>{} · BigFleet</title><style>{STYLE}</style></head><body>",
            esc(title)
        );
        out.push_str("<header><a class=\"brand\" href=\"/\">BigFleet</a><nav>");
        for (entry, href, label) in [
            (Nav::Overview, "/", "Overview"),
            (Nav::Clusters, "/clusters", "Clusters"),
            (Nav::Shortfalls, "/shortfalls", "Shortfalls"),
            (Nav::Domains, "/domains", "Domains"),
            (Nav::Actions, "/actions", "Actions"),
            (Nav::Machines, "/machines", "Machines"),
        ] {
            let current = if entry == nav {
                " aria-current=\"page\""
            } else {
                ""
            };
            let _ = write!(out, "<a href=\"{href}\"{current}>{label}</a>");
        }
        out.push_str(
            "</nav><form action=\"/cluster\" method=\"get\"><input name=\"id\" placeholder=\"cluster id\" aria-label=\"cluster id\"> <button>Open</button></form></header><main>",
        );
        Doc { out }
    }

    fn push(&mut self, s: &str) {
        self.out.push_str(s);
    }

    fn finish(mut self, computed_at: i64, refresh: bool) -> String {
        self.out.push_str("</main><footer>");
        if computed_at > 0 {
            let _ = write!(self.out, "Data assembled {}.", esc(&timestamp(computed_at)));
        }
        if refresh {
            let _ = write!(self.out, " This page reloads every {REFRESH_SECONDS} s.");
        }
        self.out.push_str(
            " JSON: <a href=\"/api/v1/summary\">/api/v1/summary</a></footer></body></html>\n",
        );
        self.out
    }
}

fn coordinator_banner(doc: &mut Doc, reachable: bool, error: &str) {
    if !reachable {
        let _ = write!(
            doc.out,
            "<div class=\"banner\" role=\"alert\"><strong>Coordinator unreachable.</strong> Showing the shards known from its last answer. <span class=\"mono\">{}</span></div>",
            esc(error)
        );
    } else if !error.is_empty() {
        let _ = write!(
            doc.out,
            "<div class=\"note\"><strong>Coordinator partly unreadable:</strong> <span class=\"mono\">{}</span></div>",
            esc(error)
        );
    }
}

fn card(doc: &mut Doc, label: &str, value: &str) {
    let _ = write!(
        doc.out,
        "<div class=\"card\"><div class=\"n\">{}</div><div class=\"l\">{}</div></div>",
        esc(value),
        esc(label)
    );
}

/// « Prev · Page x of y (n items) · Next », preserving `extra` query parameters.
fn pager<T>(doc: &mut Doc, base: &str, extra: &str, page: &Page<T>, noun: &str) {
    if page.pages <= 1 {
        let _ = write!(
            doc.out,
            "<div class=\"pager muted\">{} {}</div>",
            page.total,
            esc(noun)
        );
        return;
    }
    let link = |p: usize| format!("{base}?page={p}&amp;page_size={}{extra}", page.page_size);
    doc.push("<nav class=\"pager\" aria-label=\"pages\">");
    if page.page > 1 {
        let _ = write!(
            doc.out,
            "<a href=\"{}\" rel=\"prev\">« Prev</a>",
            link(page.page - 1)
        );
    }
    let _ = write!(
        doc.out,
        "<span>Page {} of {} ({} {})</span>",
        page.page,
        page.pages,
        page.total,
        esc(noun)
    );
    if page.page < page.pages {
        let _ = write!(
            doc.out,
            "<a href=\"{}\" rel=\"next\">Next »</a>",
            link(page.page + 1)
        );
    }
    doc.push("</nav>");
}

fn shard_status(reachable: bool, error: &str) -> String {
    if reachable {
        "<span class=\"ok\">reachable</span>".to_owned()
    } else {
        format!(
            "<span class=\"bad\">unreachable</span> <span class=\"mono\">{}</span>",
            esc(error)
        )
    }
}

/// `/`: fleet totals, machines by state, shards (one page of them), the oldest shortfalls.
pub fn overview(o: &FleetOverview, shards: &Page<crate::view::ShardView>) -> String {
    let mut doc = Doc::new("Fleet overview", Nav::Overview, true);
    doc.push("<h1>Fleet overview</h1>");
    coordinator_banner(&mut doc, o.coordinator_reachable, &o.coordinator_error);
    let s = o.summary();
    let machines: i64 = s.machines_by_state.values().sum();
    let state = |name: &str| {
        s.machines_by_state
            .get(name)
            .copied()
            .unwrap_or(0)
            .to_string()
    };
    doc.push("<div class=\"cards\">");
    card(
        &mut doc,
        "shards reachable",
        &format!("{} / {}", s.shards_reachable, s.shards_total),
    );
    card(&mut doc, "machines", &machines.to_string());
    card(&mut doc, "configured", &state("MACHINE_STATE_CONFIGURED"));
    card(&mut doc, "idle", &state("MACHINE_STATE_IDLE"));
    card(&mut doc, "failed", &state("MACHINE_STATE_FAILED"));
    card(&mut doc, "sessions", &s.sessions.to_string());
    card(&mut doc, "needs", &s.needs.to_string());
    card(&mut doc, "unmet needs", &s.unmet_needs.to_string());
    card(&mut doc, "shortfalls", &s.shortfalls.to_string());
    doc.push("</div>");

    doc.push("<h2>Machines by state</h2><div class=\"scroll\"><table><thead><tr>");
    for st in MACHINE_STATES {
        let _ = write!(
            doc.out,
            "<th class=\"num\">{}</th>",
            short_state(st.as_str_name())
        );
    }
    doc.push("</tr></thead><tbody><tr>");
    for st in MACHINE_STATES {
        let _ = write!(
            doc.out,
            "<td class=\"num\">{}</td>",
            s.machines_by_state
                .get(st.as_str_name())
                .copied()
                .unwrap_or(0)
        );
    }
    doc.push("</tr></tbody></table></div>");

    doc.push("<h2>Shards</h2>");
    if shards.total == 0 {
        doc.push("<p class=\"muted\">No shard has registered with the coordinator yet.</p>");
    } else {
        doc.push("<div class=\"scroll\"><table><thead><tr><th>Shard</th><th>Address</th><th>Status</th><th>Last report</th><th class=\"num\">Cycle</th><th class=\"num\">Machines</th><th>By state</th><th class=\"num\">Sessions</th><th class=\"num\">Needs</th><th class=\"num\">Unmet</th></tr></thead><tbody>");
        for sh in &shards.items {
            let _ = write!(
                doc.out,
                "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td>",
                esc(&sh.shard_id),
                esc(&sh.address),
                shard_status(sh.reachable, &sh.error),
                if sh.last_report_age_ms < 0 {
                    "never".to_owned()
                } else {
                    format!("{} ago", coarse(sh.last_report_age_ms))
                },
                if sh.reachable {
                    sh.cycle.to_string()
                } else {
                    "–".to_owned()
                },
            );
            // Live counts when the shard described itself; otherwise what it last reported
            // to the coordinator, marked as such.
            let (machines, by_state) = if sh.reachable && sh.source == "shard-info" {
                let parts: Vec<String> = MACHINE_STATES
                    .iter()
                    .filter_map(|st| {
                        let n = sh
                            .machines_by_state
                            .get(st.as_str_name())
                            .copied()
                            .unwrap_or(0);
                        (n != 0).then(|| {
                            format!("{} {n}", short_state(st.as_str_name()).to_lowercase())
                        })
                    })
                    .collect();
                (
                    sh.machines_by_state.values().sum::<i32>().to_string(),
                    parts.join(" · "),
                )
            } else {
                match sh.reported_total_machines {
                    Some(n) => (format!("{n}"), "as last reported".to_owned()),
                    None => ("–".to_owned(), String::new()),
                }
            };
            let _ = write!(
                doc.out,
                "<td class=\"num\">{}</td><td class=\"muted\">{}</td>",
                esc(&machines),
                esc(&by_state)
            );
            let unknown = |v: String| if sh.reachable { v } else { "–".to_owned() };
            let _ = write!(
                doc.out,
                "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                unknown(sh.sessions.to_string()),
                unknown(sh.needs.to_string()),
                unknown(if sh.unmet_needs < 0 {
                    "?".to_owned()
                } else {
                    sh.unmet_needs.to_string()
                }),
            );
        }
        doc.push("</tbody></table></div>");
        pager(&mut doc, "/", "", shards, "shards");
        let down: Vec<&str> = o
            .shards
            .iter()
            .filter(|s| !s.reachable)
            .map(|s| s.shard_id.as_str())
            .collect();
        if !down.is_empty() {
            let _ = write!(
                doc.out,
                "<div class=\"note\">{} of {} shards did not answer: <span class=\"mono\">{}</span>. Their machines and needs are not counted above.</div>",
                down.len(),
                o.shards.len(),
                esc(&down.join(", "))
            );
        }
    }

    doc.push("<h2>Oldest shortfalls</h2>");
    if o.shortfalls.is_empty() {
        doc.push("<p class=\"muted\">No shard reports unmet demand.</p>");
    } else {
        let views: Vec<ShortfallView> = o
            .shortfalls
            .iter()
            .take(10)
            .map(ShortfallView::from_proto)
            .collect();
        shortfall_table(&mut doc, &views);
        let _ = write!(
            doc.out,
            "<p><a href=\"/shortfalls\">All {} shortfalls by age →</a></p>",
            o.shortfalls.len()
        );
    }
    doc.finish(o.computed_at_unix_nanos, true)
}

fn shortfall_table(doc: &mut Doc, rows: &[ShortfallView]) {
    doc.push("<div class=\"scroll\"><table><thead><tr><th class=\"num\">Unmet for (cycles)</th><th class=\"num\">Priority</th><th>Shard</th><th>Cluster</th><th>Deficit</th><th>Requirements</th><th>Interruption penalty</th></tr></thead><tbody>");
    for s in rows {
        let cluster = if s.cluster_id.is_empty() {
            "<span class=\"muted\">unknown</span>".to_owned()
        } else {
            format!(
                "<a href=\"/clusters/{}\">{}</a>",
                pct(&s.cluster_id),
                esc(&s.cluster_id)
            )
        };
        let _ = write!(
            doc.out,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"mono\">{}</td><td>{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td>{}</td></tr>",
            s.age_cycles,
            s.priority,
            esc(&s.shard_id),
            cluster,
            esc(&resources_text(&s.deficit)),
            esc(&s.requirements.join("; ")),
            esc(&s.interruption_penalty_bucket),
        );
    }
    doc.push("</tbody></table></div>");
}

/// `/shortfalls`: every reported shortfall, oldest first, paginated.
pub fn shortfalls(o: &FleetOverview, page: &Page<ShortfallView>) -> String {
    let mut doc = Doc::new("Shortfalls", Nav::Shortfalls, true);
    doc.push("<h1>Shortfalls by age</h1>");
    coordinator_banner(&mut doc, o.coordinator_reachable, &o.coordinator_error);
    doc.push("<p class=\"muted\">From each shard's latest report to the coordinator (the worst 100 per shard, without cluster attribution). A cluster's own page shows its needs with reasons.</p>");
    if page.total == 0 {
        doc.push("<p class=\"muted\">No shard reports unmet demand.</p>");
    } else {
        shortfall_table(&mut doc, &page.items);
        pager(&mut doc, "/shortfalls", "", page, "shortfalls");
    }
    doc.finish(o.computed_at_unix_nanos, true)
}

/// `/domains`: topology domains pinned to shards.
pub fn domains(o: &FleetOverview, page: &Page<DomainView>) -> String {
    let mut doc = Doc::new("Domains", Nav::Domains, false);
    doc.push("<h1>Topology domains</h1>");
    coordinator_banner(&mut doc, o.coordinator_reachable, &o.coordinator_error);
    if page.total == 0 {
        doc.push("<p class=\"muted\">No domain is pinned to a shard.</p>");
    } else {
        doc.push("<div class=\"scroll\"><table><thead><tr><th>Key</th><th>Value</th><th>Shard</th></tr></thead><tbody>");
        for d in &page.items {
            let _ = write!(
                doc.out,
                "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
                esc(&d.topology_key),
                esc(&d.topology_value),
                esc(&d.shard_id)
            );
        }
        doc.push("</tbody></table></div>");
        pager(&mut doc, "/domains", "", page, "domains");
    }
    doc.finish(o.computed_at_unix_nanos, false)
}

fn unreachable_notes(doc: &mut Doc, shards: &[ShardFetchView]) {
    for s in shards.iter().filter(|s| !s.reachable) {
        let _ = write!(
            doc.out,
            "<div class=\"note\">Shard <strong class=\"mono\">{}</strong> (<span class=\"mono\">{}</span>) is unreachable: <span class=\"mono\">{}</span>. Its rows are missing below.</div>",
            esc(&s.shard_id),
            esc(&s.address),
            esc(&s.error)
        );
    }
}

/// `/clusters`: every cluster with demand on a reachable shard.
pub fn clusters(index: &ClusterIndex, page: &Page<ClusterView>) -> String {
    let mut doc = Doc::new("Clusters", Nav::Clusters, true);
    doc.push("<h1>Clusters</h1>");
    if !index.coordinator_error.is_empty() {
        coordinator_banner(&mut doc, false, &index.coordinator_error);
    }
    unreachable_notes(&mut doc, &index.shards);
    if page.total == 0 {
        doc.push("<p class=\"muted\">No cluster has demand on a reachable shard.</p>");
    } else {
        doc.push("<div class=\"scroll\"><table><thead><tr><th>Cluster</th><th>Shards</th><th class=\"num\">Needs</th><th class=\"num\">Unmet</th><th class=\"num\">Top priority</th><th class=\"num\">Longest unmet (cycles)</th></tr></thead><tbody>");
        for c in &page.items {
            let unmet = if c.unmet_needs > 0 {
                format!("<span class=\"bad\">{}</span>", c.unmet_needs)
            } else {
                "0".to_owned()
            };
            let _ = write!(
                doc.out,
                "<tr><td><a href=\"/clusters/{}\">{}</a></td><td class=\"mono\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                pct(&c.cluster_id),
                esc(&c.cluster_id),
                esc(&c.shards.join(", ")),
                c.needs,
                unmet,
                c.max_priority,
                c.max_age_cycles_unmet
            );
        }
        doc.push("</tbody></table></div>");
        pager(&mut doc, "/clusters", "", page, "clusters");
    }
    doc.finish(index.computed_at_unix_nanos, true)
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

fn need_row(doc: &mut Doc, index: usize, n: &NeedRow) {
    let status = if n.satisfied {
        "<span class=\"ok\">satisfied</span>".to_owned()
    } else {
        "<span class=\"bad\">unmet</span>".to_owned()
    };
    let reason = if n.satisfied {
        String::new()
    } else {
        let (label, help) = reason_label(&n.unmet_reason);
        format!(
            "<span class=\"warn\" title=\"{}\">{}</span>",
            esc(help),
            esc(label)
        )
    };
    let supply = match &n.matching_supply {
        Some(m) => format!(
            "idle {} · configured {} · speculative {}{}",
            m.idle,
            m.configured,
            m.speculative,
            if m.capped { " (capped)" } else { "" }
        ),
        None => String::new(),
    };
    let preemption = match &n.preemption {
        Some(p) => format!(
            "{} victims freeing {}",
            p.victims_found,
            resources_text(&p.capacity_freed)
        ),
        None => String::new(),
    };
    let mut same = String::new();
    if !n.same_domain.is_empty() {
        let _ = write!(same, "chosen {}", n.same_domain);
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
    let acquired = if n.bootstrap_count + n.provision_count > 0 {
        format!(
            " <span class=\"muted\">(+{} boot, +{} prov)</span>",
            n.bootstrap_count, n.provision_count
        )
    } else {
        String::new()
    };
    if n.acquisition_parked {
        let _ = write!(same, " (parked {} cycles)", n.parked_age_cycles);
    }
    let _ = write!(
        doc.out,
        "<tr><td class=\"num muted\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td class=\"num nowrap\">{}{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td class=\"num\">{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
        index,
        n.priority,
        status,
        reason,
        esc(&resources_text(&n.aggregate_resources)),
        esc(&resources_text(&n.residual_deficit)),
        n.claimed_machine_count,
        acquired,
        esc(&supply),
        esc(&preemption),
        esc(&same),
        n.age_cycles_unmet,
        esc(&n.requirements.join("; ")),
        esc(n.shard_id.as_deref().unwrap_or("")),
    );
}

/// `/clusters/{id}`: the cluster's needs with verdicts, one page at a time.
pub fn cluster(v: &ClusterNeedsView) -> String {
    let title = format!("Cluster {}", v.cluster_id);
    let mut doc = Doc::new(&title, Nav::None, true);
    let _ = write!(
        doc.out,
        "<h1>Cluster <span class=\"mono\">{}</span></h1>",
        esc(&v.cluster_id)
    );
    if !v.coordinator_error.is_empty() {
        coordinator_banner(&mut doc, false, &v.coordinator_error);
    }
    unreachable_notes(&mut doc, &v.shards);
    doc.push("<div class=\"cards\">");
    card(&mut doc, "needs", &(v.satisfied + v.unmet).to_string());
    card(&mut doc, "satisfied", &v.satisfied.to_string());
    card(&mut doc, "unmet", &v.unmet.to_string());
    doc.push("</div>");
    let base = format!("/clusters/{}", pct(&v.cluster_id));
    let _ = write!(
        doc.out,
        "<p class=\"filters\"><a href=\"{base}\"{}>All needs</a><a href=\"{base}?unmet=true\"{}>Unmet only</a> <a class=\"muted\" href=\"/api/v1/clusters/{}/needs{}\">JSON</a></p>",
        if v.unmet_only { "" } else { " class=\"on\"" },
        if v.unmet_only { " class=\"on\"" } else { "" },
        pct(&v.cluster_id),
        if v.unmet_only { "?unmet=true" } else { "" },
    );
    let reachable: Vec<&ShardFetchView> = v.shards.iter().filter(|s| s.reachable).collect();
    if v.needs.total == 0 {
        if !reachable.is_empty() && reachable.iter().all(|s| s.cycle == 0) {
            doc.push("<p class=\"muted\">No decision cycle has run yet, so there are no verdicts (not the same as no demand).</p>");
        } else if v.unmet_only && v.satisfied > 0 {
            doc.push("<p class=\"ok\">Every need of this cluster is satisfied.</p>");
        } else {
            doc.push("<p class=\"muted\">No reachable shard holds demand from this cluster.</p>");
        }
    } else {
        doc.push("<div class=\"scroll\"><table><thead><tr><th class=\"num\">#</th><th class=\"num\">Priority</th><th>Status</th><th>Unmet reason</th><th>Demand</th><th>Residual deficit</th><th class=\"num\">Claimed</th><th>Matching supply</th><th>Preemption</th><th>Same-domain</th><th class=\"num\">Unmet for (cycles)</th><th>Requirements</th><th>Shard</th></tr></thead><tbody>");
        let first = (v.needs.page - 1) * v.needs.page_size + 1;
        for (i, n) in v.needs.items.iter().enumerate() {
            need_row(&mut doc, first + i, n);
        }
        doc.push("</tbody></table></div>");
        let extra = if v.unmet_only { "&amp;unmet=true" } else { "" };
        pager(&mut doc, &base, extra, &v.needs, "needs");
    }
    if !reachable.is_empty() {
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
        let _ = write!(
            doc.out,
            "<p class=\"muted\">Verdicts are from each shard's last cycle: {}.</p>",
            esc(&cycles.join("; "))
        );
    }
    doc.finish(v.computed_at_unix_nanos, true)
}

fn shard_errors(doc: &mut Doc, errors: &[crate::view::ShardErrorView]) {
    for e in errors {
        let _ = write!(
            doc.out,
            "<div class=\"note\">Shard <strong class=\"mono\">{}</strong> did not answer: <span class=\"mono\">{}</span>. Its rows are missing below.</div>",
            esc(&e.shard_id),
            esc(&e.error)
        );
    }
}

/// `/actions`: what the shards did recently and why, newest first (ADR-0125).
pub fn actions(v: &crate::http::ActionsResponse, cluster: &str) -> String {
    let mut doc = Doc::new("Recent actions", Nav::Actions, false);
    doc.push("<h1>Recent actions</h1>");
    if !cluster.is_empty() {
        let _ = write!(
            doc.out,
            "<p>Cluster <strong class=\"mono\">{}</strong> · <a href=\"/actions\">all clusters</a></p>",
            esc(cluster)
        );
    }
    shard_errors(&mut doc, &v.unreachable);
    if v.actions.is_empty() {
        doc.push("<p class=\"muted\">No action recorded yet.</p>");
    } else {
        doc.push("<div class=\"scroll\"><table><thead><tr><th>Finished</th><th>Kind</th><th>Reason</th><th>Outcome</th><th>Cluster</th><th>Machine</th><th>Need</th><th>Priority</th><th>Ran</th><th>Shard</th></tr></thead><tbody>");
        for a in &v.actions {
            let class = match a.outcome.as_str() {
                "succeeded" => "ok",
                "failed" | "abandoned" => "bad",
                _ => "warn",
            };
            let ran = if a.started_at_unix_nanos == 0 {
                String::new()
            } else {
                coarse(a.run_nanos / 1_000_000)
            };
            let _ = write!(
                doc.out,
                "<tr><td>{}</td><td>{}</td><td class=\"mono\">{}</td><td class=\"{class}\">{}</td><td class=\"mono\"><a href=\"/actions?cluster={}\">{}</a></td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td></tr>",
                esc(&timestamp(a.finished_at_unix_nanos)),
                esc(&a.kind),
                esc(&a.reason),
                esc(&a.outcome),
                pct(&a.cluster_id),
                esc(&a.cluster_id),
                esc(&a.machine_id),
                esc(&a.need_fingerprint),
                a.priority,
                esc(&ran),
                esc(&a.shard_id)
            );
        }
        doc.push("</tbody></table></div>");
    }
    doc.finish(crate::fleet::now_unix_nanos(), false)
}

/// `/machines`: one page of the fleet's machines in id order.
pub fn machines(v: &crate::http::MachinesResponse, query: &str) -> String {
    let mut doc = Doc::new("Machines", Nav::Machines, false);
    doc.push("<h1>Machines</h1>");
    shard_errors(&mut doc, &v.unreachable);
    if v.machines.is_empty() {
        doc.push("<p class=\"muted\">No machine matches.</p>");
    } else {
        doc.push("<div class=\"scroll\"><table><thead><tr><th>Machine</th><th>State</th><th>Cluster</th><th>Instance type</th><th>Zone</th><th>Capacity</th><th>$/h</th><th>Shard</th></tr></thead><tbody>");
        for m in &v.machines {
            let _ = write!(
                doc.out,
                "<tr><td class=\"mono\">{}</td><td>{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td>{}</td><td>{:.4}</td><td class=\"mono\">{}</td></tr>",
                esc(&m.id),
                esc(short_state(&m.state)),
                esc(&m.cluster),
                esc(&m.instance_type),
                esc(&m.zone),
                esc(m.capacity_type.trim_start_matches("CAPACITY_TYPE_")),
                m.price_per_hour,
                esc(&m.shard_id)
            );
        }
        doc.push("</tbody></table></div>");
    }
    let _ = write!(
        doc.out,
        "<div class=\"pager muted\">{} machines match",
        v.total_matching
    );
    if !v.next_after.is_empty() {
        let _ = write!(
            doc.out,
            " · <a href=\"/machines?after={}{}\" rel=\"next\">Next »</a>",
            pct(&v.next_after),
            esc(query)
        );
    }
    doc.push("</div>");
    doc.finish(crate::fleet::now_unix_nanos(), false)
}

/// An error page (coordinator and every shard unknown, bad query, unknown path).
pub fn error(title: &str, message: &str) -> String {
    let mut doc = Doc::new(title, Nav::None, false);
    let _ = write!(
        doc.out,
        "<h1>{}</h1><div class=\"banner\" role=\"alert\">{}</div><p><a href=\"/\">Back to the overview</a></p>",
        esc(title),
        esc(message)
    );
    doc.finish(0, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{ShardView, SupplyView};
    use std::collections::BTreeMap;

    fn shard(id: &str, reachable: bool) -> ShardView {
        ShardView {
            shard_id: id.into(),
            address: "127.0.0.1:1".into(),
            reachable,
            error: if reachable {
                String::new()
            } else {
                "unavailable: <refused>".into()
            },
            registered_at_unix_ns: 0,
            last_report_age_ms: 1500,
            cycle: 42,
            machines_by_state: [("MACHINE_STATE_CONFIGURED".to_owned(), 7)].into(),
            sessions: 3,
            needs: 5,
            unmet_needs: 1,
            shard_epoch: 1,
            actions_in_flight: 0,
            reported_total_machines: None,
            reported_free_machines: None,
            source: "shard-info".into(),
        }
    }

    #[test]
    fn the_overview_names_down_shards_and_escapes_their_errors() {
        let o = FleetOverview {
            computed_at_unix_nanos: 1,
            coordinator_reachable: true,
            coordinator_error: String::new(),
            coordinator_failure: None,
            shards: vec![shard("s1", true), shard("s<2>", false)],
            shortfalls: vec![],
            domains: vec![],
        };
        let page = Page::of(&o.shards, 1, 50);
        let html = overview(&o, &page);
        assert!(html.contains("s&lt;2&gt;"));
        assert!(!html.contains("s<2>"));
        assert!(html.contains("unavailable: &lt;refused&gt;"));
        assert!(html.contains("1 of 2 shards did not answer"));
        assert!(html.contains("<meta http-equiv=\"refresh\""));
        assert!(!html.contains("Coordinator unreachable"));
    }

    #[test]
    fn a_down_coordinator_shows_a_banner() {
        let o = FleetOverview {
            computed_at_unix_nanos: 1,
            coordinator_reachable: false,
            coordinator_error: "coordinator http://x:1: ListShards failed".into(),
            coordinator_failure: None,
            shards: vec![],
            shortfalls: vec![],
            domains: vec![],
        };
        let html = overview(&o, &Page::of(&o.shards, 1, 50));
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
        let v = ClusterNeedsView {
            cluster_id: "c".into(),
            unmet_only: false,
            computed_at_unix_nanos: 1,
            coordinator_error: String::new(),
            shards: vec![],
            satisfied: 0,
            unmet: 1,
            needs: Page::of(&[row], 1, 50),
        };
        let html = cluster(&v);
        assert!(html.contains("priority-starved"));
        assert!(html.contains("idle 0 · configured 9 · speculative 0 (capped)"));
        assert!(html.contains("cpu=4"));
        assert!(html.contains("chosen rack-&lt;1&gt;"));
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
        let html = actions(&v, "<c>");
        assert!(
            html.contains("s&lt;1&gt;") && html.contains("m&quot;1") && html.contains("c&amp;1")
        );
        assert!(html.contains("/actions?cluster=c%261") && html.contains("&lt;c&gt;"));
        assert!(!html.contains("<c>") && !html.contains("s<1>"));
        assert!(html.contains("class=\"bad\">failed"));
    }
}
