//! `/clusters` and `/clusters/{id}`: clusters with demand, and one cluster's needs with
//! their verdicts.

use super::{
    Nav, Shell, card, cluster_link, coordinator_banner, key_history_section, layout, pager,
};
use maud::{Markup, html};

use crate::fleet::ClusterIndex;
use crate::history::{ClusterSample, KeyHistory};
use crate::html::{pct, timestamp};
use crate::view::{ClusterNeedsView, ClusterView, NeedRow, Page, ShardFetchView, resources_text};

pub(super) fn unreachable_notes(shards: &[ShardFetchView]) -> Markup {
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

pub(super) fn reason_label(reason: &str) -> (&'static str, &'static str) {
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

pub(super) fn same_domain_text(n: &NeedRow) -> String {
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

pub(super) fn need_row(index: usize, n: &NeedRow) -> Markup {
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
