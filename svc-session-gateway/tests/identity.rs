//! Identity binding under mTLS: the Hello's cluster must be the certificate's.

use crate::common;

use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_proto::mesh::v1::outbox_client::OutboxClient;
use bigfleet_proto::mesh::v1::relay_client::RelayClient;
use bigfleet_proto::mesh::v1::{SendReclaimRequest, StatusRequest};
use bigfleet_testkit::{LeafSpec, TestCa};
use common::*;
use tonic::Code;

struct Pki {
    ca: TestCa,
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        Self {
            ca: TestCa::new("gateway test ca").unwrap(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn context(&self, stem: &str, spec: &LeafSpec) -> TlsContext {
        let cert = self.ca.issue(spec).unwrap();
        let paths = self.ca.write_bundle(self.dir.path(), stem, &cert).unwrap();
        TlsContext::load(&TlsFiles::new(paths.cert, paths.key, paths.ca)).unwrap()
    }

    fn role(&self, role: &str) -> TlsContext {
        self.context(
            &bigfleet_testkit::role_file_stem(role),
            &LeafSpec::role(role),
        )
    }
}

async fn mtls_harness(pki: &Pki) -> Harness {
    Harness::start(Options {
        tls: Some(pki.role("shard/shard-0")),
        ..Options::default()
    })
    .await
}

fn https(h: &Harness) -> String {
    format!("https://{}", h.addr)
}

#[tokio::test]
async fn the_certificate_must_name_the_hello_cluster() {
    let pki = Pki::new();
    let h = mtls_harness(&pki).await;
    let rejected = || h.gw().metrics().identity_rejected.get();

    // Matching identity: accepted.
    let a = pki.role("cluster/cluster-a");
    let mut s = open_with(channel(&https(&h), Some(&a)).await, hello("cluster-a"))
        .await
        .unwrap();
    assert_eq!(s.next_ack().await.echo, "hello");

    // Each refusal is counted as a security event: (certificate, Hello cluster, the case,
    // what the refusal says).
    let refusals = [
        // Certificate for cluster-a, Hello for cluster-b.
        (
            a.clone(),
            "cluster-b",
            "impersonation must be refused",
            "bigfleet://cluster/cluster-b",
        ),
        (
            pki.context("none", &LeafSpec::loopback("no identity")),
            "cluster-a",
            "a certificate without identity must be refused",
            "exactly one bigfleet:// URI SAN",
        ),
        (
            pki.context(
                "two",
                &LeafSpec::role("cluster/cluster-a").with_uri("bigfleet://cluster/cluster-b"),
            ),
            "cluster-a",
            "an ambiguous certificate must be refused",
            "",
        ),
        // Another role entirely (a readonly dashboard certificate).
        (
            pki.role("readonly"),
            "cluster-a",
            "readonly may not open a session",
            "",
        ),
    ];
    for (counted, (cert, cluster, why, says)) in (1..).zip(refusals) {
        let ch = channel(&https(&h), Some(&cert)).await;
        refused_open(ch, hello(cluster), why, Code::PermissionDenied, says).await;
        assert_eq!(rejected(), counted, "{why}");
    }

    // The accepted session is unaffected by the refusals.
    assert_eq!(h.gw().active_sessions(), 1);
    s.send(hello("cluster-a")).await;
    assert_eq!(s.next_ack().await.echo, "hello");
    h.stop().await;
}

#[tokio::test]
async fn the_public_relay_is_for_this_shards_execute_workers_only() {
    let pki = Pki::new();
    let h = mtls_harness(&pki).await;
    let reclaim = |ctx: TlsContext| {
        let target = https(&h);
        async move {
            RelayClient::new(channel(&target, Some(&ctx)).await)
                .send_reclaim(SendReclaimRequest {
                    cluster_id: "cluster-a".into(),
                    ..Default::default()
                })
                .await
        }
    };
    assert!(reclaim(pki.role("shard/shard-0/execute")).await.is_ok());
    let err = reclaim(pki.role("shard/shard-1/execute"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "another shard's worker");
    let err = reclaim(pki.role("cluster/cluster-a")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "an operator");
    // Decide's contract is not served on the public port at all, whoever asks: the
    // deny-by-default policy refuses the unknown service before routing.
    for role in ["shard/shard-0/execute", "shard/shard-0", "admin"] {
        let err = OutboxClient::new(channel(&https(&h), Some(&pki.role(role))).await)
            .status(StatusRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{role}");
    }
    h.stop().await;
}
