//! External tools against a running svc-inspect (with doubles behind it): grpcurl lists,
//! describes and calls; headless Chromium renders the dashboard. Each test skips with a
//! notice when its tool's variable (see `.tools/env`) is unset.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bigfleet_testkit::tools::{run, tool};
use common::{Harness, Options, Pki, shoot_and_expect};

fn grpcurl(bin: &Path, tls: Option<(&Pki, &str)>, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    match tls {
        None => {
            cmd.arg("-plaintext");
        }
        Some((pki, role)) => {
            let f = pki.files(role);
            cmd.arg("-cacert")
                .arg(&f.ca)
                .arg("-cert")
                .arg(&f.cert)
                .arg("-key")
                .arg(&f.key);
        }
    }
    cmd.args(["-max-time", "10"]).args(args);
    cmd
}

/// grpcurl over plaintext: its output; fails when grpcurl does.
async fn grpcurl_ok(bin: &Path, args: &[&str]) -> String {
    let (ok, out, err) = run(grpcurl(bin, None, args)).await;
    assert!(ok, "grpcurl {args:?}: {err}");
    out
}

#[tokio::test]
async fn grpcurl_lists_describes_and_calls_inspect_needs() {
    let Some(bin) = tool("BIGFLEET_GRPCURL") else {
        return;
    };
    let h = Harness::start(Options::default()).await;
    let addr = h.inspect().grpc_addr().to_string();

    let out = grpcurl_ok(&bin, &[&addr, "list"]).await;
    for svc in [
        "bigfleet.v1alpha1.ShardRead",
        "bigfleet.mesh.v1.Inspect",
        "grpc.health.v1.Health",
    ] {
        assert!(
            out.lines().any(|l| l.trim() == svc),
            "list lacks {svc}: {out}"
        );
    }

    let out = grpcurl_ok(&bin, &[&addr, "describe", "bigfleet.v1alpha1.ShardRead"]).await;
    assert!(out.contains("rpc InspectNeeds ( .bigfleet.v1alpha1.InspectNeedsRequest ) returns ( stream .bigfleet.v1alpha1.InspectNeedsResponse )"), "{out}");
    let out = grpcurl_ok(&bin, &[&addr, "describe", "bigfleet.v1alpha1.NeedView"]).await;
    assert!(out.contains("unmet_reason"), "{out}");

    let out = grpcurl_ok(
        &bin,
        &[
            "-d",
            r#"{"cluster_id":"c-a","limit":2}"#,
            &addr,
            "bigfleet.v1alpha1.ShardRead/InspectNeeds",
        ],
    )
    .await;
    let header_at = out.find("\"header\"").expect("a header frame");
    let need_at = out.find("\"need\"").expect("need frames");
    assert!(header_at < need_at, "header first: {out}");
    assert_eq!(out.matches("\"clusterId\": \"c-a\"").count(), 2, "{out}");
    assert!(out.contains("UNMET_REASON_PRIORITY_STARVED"), "{out}");
    assert!(out.contains("\"totalNeeds\": 3"), "{out}");

    let out = grpcurl_ok(&bin, &[&addr, "bigfleet.mesh.v1.Inspect/FleetSummary"]).await;
    assert!(
        out.contains("\"shardId\": \"s3\"") && out.contains("\"coordinatorReachable\": true"),
        "{out}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn grpcurl_over_mtls_follows_the_role_matrix() {
    let Some(bin) = tool("BIGFLEET_GRPCURL") else {
        return;
    };
    let h = Harness::start(Options {
        tls_role: Some("readonly"),
        ..Options::default()
    })
    .await;
    let pki = h.pki.as_ref().unwrap();
    let addr = h.inspect().grpc_addr().to_string();
    let call = [
        "-d",
        r#"{"cluster_id":"c-b"}"#,
        addr.as_str(),
        "bigfleet.v1alpha1.ShardRead/InspectNeeds",
    ];

    let (ok, out, err) = run(grpcurl(&bin, Some((pki, "readonly")), &call)).await;
    assert!(ok, "{err}");
    assert!(out.contains("\"clusterId\": \"c-b\""), "{out}");

    let (ok, _, err) = run(grpcurl(&bin, Some((pki, "cluster/c-b")), &call)).await;
    assert!(!ok);
    assert!(err.contains("PermissionDenied"), "{err}");

    let (ok, _, err) = run(grpcurl(&bin, None, &call)).await;
    assert!(!ok, "plaintext must not reach an mTLS server: {err}");
    h.shutdown().await;
}

#[tokio::test]
async fn headless_chromium_renders_the_overview_and_a_cluster_page() {
    let Some(bin) = tool("BIGFLEET_CHROMIUM") else {
        return;
    };
    let h = Harness::start(Options {
        cache_ttl: Duration::from_secs(2),
        ..Options::default()
    })
    .await;
    let base = format!("http://{}", h.inspect().http_addr());
    shoot_and_expect(
        &bin,
        &format!("{base}/"),
        "dashboard-overview.png",
        &[
            "Fleet overview",
            "2 / 3 shards reachable",
            "s3",
            "unreachable",
            "Oldest shortfalls",
        ],
    )
    .await;
    shoot_and_expect(
        &bin,
        &format!("{base}/clusters/c-a"),
        "dashboard-cluster.png",
        &[
            "Cluster c-a",
            "priority-starved",
            "preemption exhausted",
            "Shard s3",
            "Unmet only",
        ],
    )
    .await;
    h.shutdown().await;
}
