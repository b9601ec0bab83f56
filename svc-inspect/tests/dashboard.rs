//! The dashboard's time axis (ADR-0136): sampled history as JSON, sparklines on the pages,
//! per-shard and per-cluster pages, escaping by the template library, the strict CSP, and
//! — in headless Chromium — pages that update in place without a reload.

use crate::common;

use std::time::Duration;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_testkit::tools::tool;
use bigfleet_testkit::wait_until;
use common::cdp::Browser;
use common::{Harness, Options, get_json, http_get, shoot_and_expect, shortfall};
use svc_inspect::doubles::{ShardDouble, need, sample_transfers};
use svc_inspect::history::{ClusterSample, FleetHistory, KeyHistory, ShardSample};
use svc_inspect::http::{CONTENT_SECURITY_POLICY, ErrorResponse};

/// Bound on waiting for the sampler or the page: a liveness bound, not a measurement.
const PATIENCE: Duration = Duration::from_secs(30);

async fn history(h: &Harness) -> FleetHistory {
    let (status, v) = get_json(h, "/api/v1/history").await;
    assert_eq!(status, 200);
    v
}

/// Waits until the sampler has recorded more than `n` samples.
async fn samples_beyond(h: &Harness, n: usize) -> FleetHistory {
    wait_until(PATIENCE, &format!("more than {n} samples"), async || {
        let v = history(h).await;
        if v.samples.len() > n {
            Ok(v)
        } else {
            Err(format!("the sampler stayed at {} samples", v.samples.len()))
        }
    })
    .await
}

fn sampled(opts: Options) -> Options {
    Options {
        sample_interval: Duration::from_millis(100),
        ..opts
    }
}

#[tokio::test]
async fn history_is_sampled_and_served_per_fleet_shard_and_cluster() {
    let h = Harness::start(sampled(Options::default())).await;
    let first = samples_beyond(&h, 0).await;
    assert_eq!(first.interval_ms, 100);
    assert_eq!(first.capacity, 720);
    let s = &first.samples[0];
    // s1 describes itself (7 configured + 2 idle); s2 has no ShardInfo; s3 is down.
    assert_eq!((s.shards_total, s.shards_reachable), (3, 2));
    assert_eq!((s.machines, s.configured, s.idle), (9, 7, 2));
    assert_eq!(s.shortfalls, 3);
    assert_eq!(s.clusters, Some(3));

    // The fleet changes: two more shortfalls reach the coordinator.
    h.coordinator.state().reports[0]
        .shortfalls
        .extend([shortfall(2, 10, 1), shortfall(3, 10, 1)]);
    let later = wait_until(PATIENCE, "a sample with 5 shortfalls", async || {
        let v = history(&h).await;
        if v.samples.last().unwrap().shortfalls == 5 {
            Ok(v)
        } else {
            Err(format!("{v:?}"))
        }
    })
    .await;
    assert_eq!(later.samples[0].shortfalls, 3, "the past is kept");
    assert!(
        later
            .samples
            .windows(2)
            .all(|w| w[0].at_unix_ms <= w[1].at_unix_ms)
    );

    let (status, c): (_, KeyHistory<ClusterSample>) =
        get_json(&h, "/api/v1/clusters/c-a/history").await;
    assert_eq!(status, 200);
    // c-a: three needs over s1 and s2, two unmet.
    let last = c.samples.last().unwrap();
    assert_eq!((c.id.as_str(), last.needs, last.unmet_needs), ("c-a", 3, 2));
    let (status, s3): (_, KeyHistory<ShardSample>) =
        get_json(&h, "/api/v1/shards/s3/history").await;
    assert_eq!(status, 200);
    assert!(s3.samples.iter().all(|s| !s.reachable));
    let (status, e): (_, ErrorResponse) = get_json(&h, "/api/v1/clusters/nope/history").await;
    assert_eq!(status, 404);
    assert!(e.error.contains("not tracked"), "{}", e.error);

    // The pages draw it.
    let addr = h.inspect().http_addr();
    let (_, _, page) = http_get(addr, "/").await;
    assert_eq!(page.matches("<figure class=\"spark\"").count(), 9, "{page}");
    assert!(page.contains("data-series=\"shortfalls\""));
    let (_, _, page) = http_get(addr, "/clusters/c-a").await;
    assert_eq!(page.matches("<figure class=\"spark\"").count(), 3, "{page}");
    assert!(page.contains("href=\"/machines?cluster=c-a\""));
    h.shutdown().await;
}

#[tokio::test]
async fn shard_pages_and_unknown_ids() {
    let h = Harness::start(sampled(Options::default())).await;
    samples_beyond(&h, 0).await;
    let addr = h.inspect().http_addr();
    let (status, _, page) = http_get(addr, "/shards/s1").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("Shard <span class=\"mono\">s1</span>"),
        "{page}"
    );
    assert_eq!(page.matches("<figure class=\"spark\"").count(), 5, "{page}");
    assert!(
        page.contains("href=\"/machines?shard=s1\"") && page.contains("href=\"/actions?shard=s1\"")
    );
    // The overview links every shard to its page.
    let (_, _, overview) = http_get(addr, "/").await;
    assert!(overview.contains("href=\"/shards/s3\""), "{overview}");
    // A down shard still has a page saying so.
    let (status, _, page) = http_get(addr, "/shards/s3").await;
    assert_eq!(status, 200);
    assert!(page.contains("unreachable"));

    let (status, _, page) = http_get(addr, "/shards/s9").await;
    assert_eq!(status, 404);
    assert!(
        page.contains("Unknown shard") && page.contains("no shard &quot;s9&quot;"),
        "{page}"
    );
    // Every shard answered after a cycle and none holds the cluster: unknown.
    let h2 = Harness::start(Options {
        with_dead_shard: false,
        ..Options::default()
    })
    .await;
    let (status, _, page) = http_get(h2.inspect().http_addr(), "/clusters/nope").await;
    assert_eq!(status, 404, "{page}");
    assert!(page.contains("Unknown cluster"));
    // With a shard down, it might be there: the page renders and says what is missing.
    let (status, _, page) = http_get(addr, "/clusters/nope").await;
    assert_eq!(status, 200);
    assert!(page.contains("is unreachable"));
    h2.shutdown().await;
    h.shutdown().await;
}

#[tokio::test]
async fn pages_ship_a_strict_csp_and_their_own_assets() {
    let h = Harness::start(Options::default()).await;
    let addr = h.inspect().http_addr();
    let (status, headers, page) = http_get(addr, "/").await;
    assert_eq!(status, 200);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(header("content-security-policy"), CONTENT_SECURITY_POLICY);
    assert!(CONTENT_SECURITY_POLICY.contains("script-src 'self';"));
    assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
    assert_eq!(header("x-content-type-options"), "nosniff");
    // Nothing inline for the CSP to block: no <style>, no inline script, no style="".
    assert!(
        !page.contains("<style") && !page.contains("style=\""),
        "{page}"
    );
    assert!(!page.contains("<script>"));
    assert!(
        !page.contains("http-equiv=\"refresh\""),
        "no full-page reload"
    );

    let assets: [(&str, &str, &[&str]); 2] = [
        (
            "/static/live.js",
            "text/javascript",
            &["getElementById(\"live\")", "replaceChildren"],
        ),
        ("/static/dashboard.css", "text/css", &["figure.spark"]),
    ];
    for (path, content_type, expected) in assets {
        let (status, headers, body) = http_get(addr, path).await;
        assert_eq!(status, 200, "{path}");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "content-type" && v.starts_with(content_type)),
            "{path}: {headers:?}"
        );
        for e in expected {
            assert!(body.contains(e), "{path} lacks {e:?}");
        }
    }
    h.shutdown().await;
}

#[tokio::test]
async fn names_are_escaped_on_every_page_that_shows_them() {
    let evil = "<script>alert(1)</script>";
    let escaped = "&lt;script&gt;alert(1)&lt;/script&gt;";
    let shard_id = "s<b>";
    let h = Harness::start(sampled(Options {
        shards: vec![ShardDouble {
            description: Some(mesh::ShardDescription {
                shard_id: shard_id.into(),
                cycle: 1,
                ..Default::default()
            }),
            actions: vec![mesh::ActionRecord {
                shard_id: shard_id.into(),
                seq: 1,
                kind: "bootstrap".into(),
                reason: evil.into(),
                machine_id: "m-1".into(),
                cluster_id: evil.into(),
                outcome: "succeeded".into(),
                finished_at_unix_nanos: 10,
                ..Default::default()
            }],
            machines: vec![mesh::MachineRow {
                shard_id: shard_id.into(),
                machine: Some(pb::Machine {
                    id: "m-1".into(),
                    state: pb::MachineState::Configured as i32,
                    cluster: evil.into(),
                    zone: evil.into(),
                    ..Default::default()
                }),
                idle_since_unix_nanos: 0,
            }],
            ..ShardDouble::with_verdicts(
                shard_id,
                1,
                1,
                vec![need(evil, 1, 1, Some(pb::UnmetReason::NoMatchingSupply))],
            )
        }],
        with_dead_shard: false,
        ..Options::default()
    }))
    .await;
    samples_beyond(&h, 0).await;
    let enc = "%3Cscript%3Ealert%281%29%3C%2Fscript%3E";
    let pages = [
        "/".to_owned(),
        "/clusters".to_owned(),
        format!("/clusters/{enc}"),
        "/shards/s%3Cb%3E".to_owned(),
        "/domains".to_owned(),
        "/actions".to_owned(),
        format!("/actions?cluster={enc}"),
        "/machines".to_owned(),
        format!("/machines?cluster={enc}"),
    ];
    h.coordinator.state().domains.push(pb::DomainAssignment {
        topology_key: "rack".into(),
        topology_value: evil.into(),
        shard_id: shard_id.into(),
    });
    for path in &pages {
        let (status, _, page) = http_get(h.inspect().http_addr(), path).await;
        assert_eq!(status, 200, "{path}: {page}");
        assert!(!page.contains(evil), "{path}: raw markup leaked: {page}");
        assert!(!page.contains("s<b>"), "{path}: raw shard id leaked");
        assert!(
            page.contains(escaped) || page.contains("s&lt;b&gt;"),
            "{path} shows neither name: {page}"
        );
    }
    let (_, _, page) = http_get(h.inspect().http_addr(), "/clusters").await;
    assert!(page.contains(escaped) && page.contains(&format!("href=\"/clusters/{enc}\"")));
    let (_, _, page) = http_get(h.inspect().http_addr(), "/").await;
    assert!(page.contains("s&lt;b&gt;") && page.contains("href=\"/shards/s%3Cb%3E\""));
    h.shutdown().await;
}

/// The text of the overview's `shortfalls` card, the shortfalls sparkline's last value and
/// range, whether the first load's marker survives, and how many in-place swaps ran.
const PROBE: &str = r#"(() => {
  const card = [...document.querySelectorAll(".card")]
    .find(c => c.querySelector(".l").textContent === "shortfalls");
  const spark = document.querySelector('figure.spark[data-series="shortfalls"]');
  return {
    card: card ? card.querySelector(".n").textContent : null,
    last: spark ? spark.dataset.last : null,
    range: spark ? spark.querySelector(".range").textContent : null,
    charts: document.querySelectorAll("figure.spark svg").length,
    marker: window.bigfleetTestMarker || null,
    swaps: window.bigfleetLive ? window.bigfleetLive.swaps : -1,
  };
})()"#;

#[tokio::test]
async fn headless_chromium_sees_charts_and_values_change_without_a_reload() {
    let Some(bin) = tool("BIGFLEET_CHROMIUM") else {
        return;
    };
    let h = Harness::start(Options {
        sample_interval: Duration::from_millis(200),
        page_refresh: Duration::from_secs(1),
        ..Options::default()
    })
    .await;
    samples_beyond(&h, 1).await;
    let mut browser = Browser::launch(&bin).await;
    let tab = browser
        .open(&format!("http://{}/", h.inspect().http_addr()))
        .await;

    wait_until(PATIENCE, "the page to load", async || {
        browser
            .eval(
                &tab,
                "document.readyState === 'complete' && !!window.bigfleetLive",
            )
            .await
            == serde_json::Value::Bool(true)
    })
    .await;
    let first = browser.eval(&tab, PROBE).await;
    assert_eq!(first["charts"], 9, "{first}");
    assert_eq!(first["card"], "3", "{first}");
    assert_eq!(first["last"], "3", "{first}");
    // Anything on `window` is lost by a reload; the in-place refresh keeps it.
    browser
        .eval(&tab, "window.bigfleetTestMarker = 'first load'")
        .await;

    // The fleet changes between two samples.
    let before = history(&h).await.samples.len();
    h.coordinator.state().reports[0]
        .shortfalls
        .push(shortfall(2, 10, 1));
    samples_beyond(&h, before + 1).await;

    let now = wait_until(PATIENCE, "the page to show the new value", async || {
        let v = browser.eval(&tab, PROBE).await;
        if v["card"] == "4" && v["last"] == "4" {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await;
    assert_eq!(now["marker"], "first load", "the page was reloaded: {now}");
    assert!(now["swaps"].as_i64().unwrap() >= 1, "{now}");
    assert_eq!(now["range"], "3–4", "the chart spans both samples: {now}");
    assert_eq!(now["charts"], 9, "{now}");
    browser.close().await;

    // A picture of the charts for people (and a check that they render to real pixels).
    shoot_and_expect(
        &bin,
        &format!("http://{}/", h.inspect().http_addr()),
        "dashboard-history.png",
        &["History", "shortfalls"],
    )
    .await;
    h.shutdown().await;
}

#[tokio::test]
async fn shard_pages_show_domains_pending_instructions_and_transfers() {
    let h = Harness::start(Options::default()).await;
    h.coordinator.state().transfers = sample_transfers();
    let addr = h.inspect().http_addr();
    let (status, _, page) = http_get(addr, "/shards/s1").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Domains and transfers"), "{page}");
    assert!(
        page.contains("<span class=\"mono domains\">topology.kubernetes.io/zone=eu-west-1a</span>"),
        "{page}"
    );
    assert!(
        page.contains("<span class=\"mono pending\">9b24f1087cda4ea8</span>"),
        "{page}"
    );
    // In flight first, then the finished one.
    let active = page.find(">t-2<").expect("active transfer row");
    let done = page.find(">t-1<").expect("recent transfer row");
    assert!(active < done);
    assert!(
        page.contains("<tr data-phase=\"adopt\">") && page.contains("<tr data-phase=\"done\">")
    );
    assert!(
        page.contains("9b24f1087cda4ea8 → s1") && page.contains("2 x gpu"),
        "{page}"
    );
    // The page asked the coordinator for this shard only.
    assert!(
        h.coordinator
            .state()
            .calls
            .iter()
            .any(|c| c == "ListTransfers")
    );

    // A shard with no domains and no transfers says so.
    let (status, _, page) = http_get(addr, "/shards/s3").await;
    assert_eq!(status, 200);
    assert!(page.contains("none pinned") && page.contains("No transfer gives or receives"));
    h.shutdown().await;
}
