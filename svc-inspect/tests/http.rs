//! The JSON API and the dashboard pages over real HTTP, against doubles.

use crate::common;

use bigfleet_proto::v1alpha1 as pb;
use common::{Harness, Options, get_json, http_get};
use svc_inspect::doubles::{ShardDouble, need};
use svc_inspect::http::{
    ClustersResponse, DomainsResponse, ErrorResponse, ShardsResponse, ShortfallsResponse,
};
use svc_inspect::view::{ClusterNeedsView, SummaryView};

async fn get_page(h: &Harness, path: &str) -> (u16, String) {
    let (status, _, body) = http_get(h.inspect().http_addr(), path).await;
    (status, body)
}

/// The visible text of a page: tags dropped, entities left as they are.
fn text(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    let mut in_style = false;
    let lower = html.to_lowercase();
    let mut i = 0;
    let b = html.as_bytes();
    while i < b.len() {
        if lower[i..].starts_with("<style") {
            in_style = true;
        }
        if in_style && lower[i..].starts_with("</style>") {
            in_style = false;
        }
        let c = b[i] as char;
        if c == '<' {
            in_tag = true;
            out.push(' ');
        } else if c == '>' {
            in_tag = false;
        } else if !in_tag && !in_style {
            out.push_str(&html[i..i + html[i..].chars().next().unwrap().len_utf8()]);
            i += html[i..].chars().next().unwrap().len_utf8();
            continue;
        }
        i += 1;
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn json_api_serves_shards_summary_shortfalls_domains_and_clusters() {
    let h = Harness::start(Options::default()).await;

    let (status, shards): (_, ShardsResponse) = get_json(&h, "/api/v1/shards").await;
    assert_eq!(status, 200);
    assert!(shards.coordinator_reachable);
    let ids: Vec<_> = shards
        .shards
        .items
        .iter()
        .map(|s| (s.shard_id.as_str(), s.reachable))
        .collect();
    assert_eq!(ids, vec![("s1", true), ("s2", true), ("s3", false)]);
    let s3 = &shards.shards.items[2];
    assert!(s3.error.starts_with("unavailable"), "{}", s3.error);
    assert_eq!(
        s3.reported_total_machines,
        Some(11),
        "the last report still shows"
    );
    assert_eq!(shards.shards.items[1].source, "inspect-needs");
    assert_eq!(shards.shards.items[1].unmet_needs, -1);

    let (_, summary): (_, SummaryView) = get_json(&h, "/api/v1/summary").await;
    assert_eq!((summary.shards_total, summary.shards_reachable), (3, 2));
    assert_eq!(
        summary.machines_by_state.get("MACHINE_STATE_IDLE"),
        Some(&2)
    );
    assert_eq!(
        (summary.sessions, summary.needs, summary.unmet_needs),
        (2, 6, 1)
    );

    let (_, shortfalls): (_, ShortfallsResponse) = get_json(&h, "/api/v1/shortfalls").await;
    let ages: Vec<_> = shortfalls
        .shortfalls
        .items
        .iter()
        .map(|s| s.age_cycles)
        .collect();
    assert_eq!(ages, vec![40, 12, 3], "oldest first");
    assert_eq!(
        shortfalls.shortfalls.items[0]
            .deficit
            .get("cpu")
            .map(String::as_str),
        Some("1")
    );

    let (_, domains): (_, DomainsResponse) = get_json(&h, "/api/v1/domains").await;
    assert_eq!(domains.domains.items.len(), 1);
    assert_eq!(domains.domains.items[0].topology_value, "r1");

    let (_, clusters): (_, ClustersResponse) = get_json(&h, "/api/v1/clusters").await;
    let c: Vec<_> = clusters
        .clusters
        .items
        .iter()
        .map(|c| {
            (
                c.cluster_id.as_str(),
                c.shards.join(","),
                c.needs,
                c.unmet_needs,
            )
        })
        .collect();
    assert_eq!(
        c,
        vec![
            ("c-a", "s1,s2".to_owned(), 3, 2),
            ("c-b", "s1".to_owned(), 1, 1),
            ("c-c", "s2".to_owned(), 2, 1)
        ]
    );
    assert!(
        clusters
            .shards
            .iter()
            .any(|s| s.shard_id == "s3" && !s.reachable)
    );
    h.shutdown().await;
}

#[tokio::test]
async fn cluster_needs_json_filters_unmet_and_paginates() {
    let h = Harness::start(Options::default()).await;
    let (status, v): (_, ClusterNeedsView) = get_json(&h, "/api/v1/clusters/c-a/needs").await;
    assert_eq!(status, 200);
    assert_eq!((v.satisfied, v.unmet, v.needs.total), (1, 2, 3));
    let first = &v.needs.items[0];
    assert_eq!(
        (
            first.priority,
            first.unmet_reason.as_str(),
            first.shard_id.as_deref()
        ),
        (100, "PRIORITY_STARVED", Some("s1"))
    );
    assert_eq!(
        first.residual_deficit.get("cpu").map(String::as_str),
        Some("4")
    );
    assert_eq!(first.matching_supply.as_ref().unwrap().configured, 3);

    let (_, unmet): (_, ClusterNeedsView) = get_json(
        &h,
        "/api/v1/clusters/c-a/needs?unmet=true&page=2&page_size=1",
    )
    .await;
    assert!(unmet.unmet_only);
    assert_eq!(
        (unmet.needs.page, unmet.needs.pages, unmet.needs.total),
        (2, 2, 2)
    );
    assert_eq!(unmet.needs.items.len(), 1);
    assert_eq!(unmet.needs.items[0].unmet_reason, "PREEMPTION_EXHAUSTED");
    assert!(
        unmet
            .shards
            .iter()
            .any(|s| s.shard_id == "s3" && !s.reachable)
    );

    let (status, err): (_, ErrorResponse) =
        get_json(&h, "/api/v1/clusters/c-a/needs?page=zero").await;
    assert_eq!(status, 400);
    assert!(
        err.error.contains("page must be a positive integer"),
        "{}",
        err.error
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_bad_page_number_is_a_400_in_the_format_of_the_route() {
    let h = Harness::start(Options::default()).await;
    for route in [
        "/api/v1/shards",
        "/api/v1/clusters",
        "/api/v1/shortfalls",
        "/api/v1/domains",
    ] {
        let (status, err): (_, ErrorResponse) = get_json(&h, &format!("{route}?page_size=0")).await;
        assert_eq!(status, 400, "{route}");
        assert!(
            err.error.contains("page_size must be a positive integer"),
            "{route}: {}",
            err.error
        );
    }
    for route in ["/", "/clusters", "/shortfalls", "/domains"] {
        let (status, page) = get_page(&h, &format!("{route}?page=zero")).await;
        assert_eq!(status, 400, "{route}");
        let t = text(&page);
        assert!(
            t.contains("Bad request") && t.contains("page must be a positive integer"),
            "{route}: {t}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn big_clusters_are_never_dumped_whole() {
    let many: Vec<pb::NeedView> = (0..1_200)
        .map(|i| need("big", i % 7, i64::from(i), None))
        .collect();
    let h = Harness::start(Options {
        shards: vec![ShardDouble::with_verdicts("s1", 3, 1, many)],
        with_dead_shard: false,
        ..Options::default()
    })
    .await;
    let (_, v): (_, ClusterNeedsView) = get_json(&h, "/api/v1/clusters/big/needs").await;
    assert_eq!(
        (v.needs.items.len(), v.needs.total, v.needs.pages),
        (50, 1_200, 24)
    );
    let (_, v): (_, ClusterNeedsView) =
        get_json(&h, "/api/v1/clusters/big/needs?page_size=100000&page=3").await;
    assert_eq!(
        (v.needs.page_size, v.needs.items.len()),
        (500, 200),
        "capped at 500 rows"
    );

    let (status, page) = get_page(&h, "/clusters/big?page=24").await;
    assert_eq!(status, 200);
    let rows = page.matches("<tr><td class=\"num muted\">").count();
    assert_eq!(rows, 50);
    let t = text(&page);
    assert!(t.contains("Page 24 of 24 (1200 needs)"), "{t}");
    assert!(t.contains("« Prev") && !t.contains("Next »"));
    h.shutdown().await;
}

#[tokio::test]
async fn dashboard_pages_show_the_fleet_and_say_what_is_down() {
    let mut h = Harness::start(Options::default()).await;
    let (status, page) = get_page(&h, "/").await;
    assert_eq!(status, 200);
    let t = text(&page);
    for expected in [
        "Fleet overview",
        "2 / 3 shards reachable",
        "s1",
        "s2",
        "s3",
        "unreachable",
        "1 of 3 shards did not answer: s3",
        "Oldest shortfalls",
        "cpu=1",
    ] {
        assert!(t.contains(expected), "overview lacks {expected:?}: {t}");
    }
    assert!(!t.contains("Coordinator unreachable"));

    let (_, page) = get_page(&h, "/clusters/c-a").await;
    let t = text(&page);
    for expected in [
        "Cluster c-a",
        "3 needs",
        "1 satisfied",
        "2 unmet",
        "priority-starved",
        "preemption exhausted",
        "idle 0 · configured 3 · speculative 0",
        "Shard s3",
        "is unreachable",
        "Its rows are missing below",
    ] {
        assert!(t.contains(expected), "cluster page lacks {expected:?}: {t}");
    }
    let (_, page) = get_page(&h, "/clusters").await;
    assert!(text(&page).contains("c-b"));
    let (_, page) = get_page(&h, "/shortfalls").await;
    assert!(text(&page).contains("Shortfalls by age"));
    let (_, page) = get_page(&h, "/domains").await;
    assert!(text(&page).contains("rack r1 s1"));

    let (status, headers, _) = http_get(h.inspect().http_addr(), "/cluster?id=c%20a").await;
    assert!((300..400).contains(&status));
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "location" && v == "/clusters/c%20a"),
        "{headers:?}"
    );
    let (status, page) = get_page(&h, "/no/such/page").await;
    assert_eq!(status, 404);
    assert!(text(&page).contains("There is no such page."));

    // The coordinator goes away: the page says so and still shows the shards.
    h.stop_coordinator().await;
    let (_, page) = get_page(&h, "/").await;
    let t = text(&page);
    assert!(t.contains("Coordinator unreachable."), "{t}");
    assert!(
        t.contains("s1") && t.contains("2 / 3 shards reachable"),
        "{t}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn fleet_data_is_html_escaped() {
    let evil = "<script>alert('x')</script>";
    let h = Harness::start(Options {
        shards: vec![ShardDouble::with_verdicts(
            "s1",
            1,
            1,
            vec![need(evil, 1, 1, Some(pb::UnmetReason::NoMatchingSupply))],
        )],
        with_dead_shard: false,
        ..Options::default()
    })
    .await;
    h.coordinator.state().domains.push(pb::DomainAssignment {
        topology_key: "rack".into(),
        topology_value: "<img src=x onerror=alert(1)>".into(),
        shard_id: "s1".into(),
    });
    let (_, clusters) = get_page(&h, "/clusters").await;
    assert!(!clusters.contains(evil), "raw markup leaked");
    // The template library escapes `&`, `<`, `>` and `"`; attributes are always
    // double-quoted, so an apostrophe is inert.
    assert!(clusters.contains("&lt;script&gt;alert('x')&lt;/script&gt;"));
    assert!(clusters.contains("href=\"/clusters/%3Cscript%3Ealert%28%27x%27%29%3C%2Fscript%3E\""));

    let (status, page) = get_page(
        &h,
        "/clusters/%3Cscript%3Ealert%28%27x%27%29%3C%2Fscript%3E",
    )
    .await;
    assert_eq!(status, 200);
    assert!(!page.contains(evil));
    assert!(page.contains("Cluster <span class=\"mono\">&lt;script&gt;"));
    assert!(text(&page).contains("no matching supply"));

    let (_, domains) = get_page(&h, "/domains").await;
    assert!(!domains.contains("<img src=x"));
    assert!(domains.contains("&lt;img src=x onerror=alert(1)&gt;"));
    h.shutdown().await;
}

#[tokio::test]
async fn a_coordinator_never_reached_is_a_clear_503_and_a_banner() {
    let inspect = common::start_without_coordinator().await;
    let (status, _, body) = http_get(inspect.http_addr(), "/api/v1/clusters/c1/needs").await;
    assert_eq!(status, 503);
    let err: ErrorResponse = serde_json::from_str(&body).unwrap();
    assert!(
        err.error
            .contains("coordinator unreachable and no shard known yet"),
        "{}",
        err.error
    );
    let (status, _, page) = http_get(inspect.http_addr(), "/").await;
    assert_eq!(status, 200, "the overview still renders");
    let t = text(&page);
    assert!(t.contains("Coordinator unreachable."), "{t}");
    assert!(t.contains("No shard has registered"), "{t}");
    inspect.shutdown().await.unwrap();
}
