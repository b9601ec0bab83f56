//! The mesh under mTLS: identities from role certificates, the authorization policy, the
//! per-identity rate limit, and what happens to callers without a usable certificate.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_mesh::{
    AuthzPolicy, ChannelConfig, MeshChannel, MeshServer, Role, RunningServer, ServerStackConfig,
    dial,
};
use bigfleet_testkit::{LeafSpec, TestCa};
use common::{Echo, SAY, assert_refused, code, dial_once, no_retry, rate_limited, say};
use tonic::Code;

fn ctx_for(ca: &TestCa, dir: &Path, stem: &str, spec: &LeafSpec) -> TlsContext {
    let cert = ca.issue(spec).unwrap();
    let p = ca.write_bundle(dir, stem, &cert).unwrap();
    TlsContext::load(&TlsFiles::new(p.cert, p.key, p.ca)).unwrap()
}

async fn client(addr: &str, ctx: &TlsContext) -> MeshChannel {
    dial(
        addr,
        &ChannelConfig::default().with_tls(Some(ctx.client_config().unwrap())),
        &no_retry(),
    )
    .await
    .unwrap()
}

struct Fixture {
    _dir: tempfile::TempDir,
    ca: TestCa,
    server: RunningServer,
    https: String,
    unix: String,
}

impl Fixture {
    fn ctx(&self, stem: &str, spec: &LeafSpec) -> TlsContext {
        ctx_for(&self.ca, self._dir.path(), stem, spec)
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh test ca").unwrap();
    let server_ctx = ctx_for(&ca, dir.path(), "server", &LeafSpec::role("shard/s1"));
    let cfg = ServerStackConfig {
        authz: Arc::new(
            AuthzPolicy::deny_by_default().allow_method(SAY, &[Role::Readonly, Role::Admin]),
        ),
        ..rate_limited(0.01, 2)
    };
    let sock = dir.path().join("echo.sock");
    let server = MeshServer::new("echo", cfg)
        .tcp("127.0.0.1:0".parse().unwrap())
        .unix(&sock)
        .tls(Some(server_ctx.server_config().unwrap()))
        .add_service(Echo::default())
        .start()
        .await
        .unwrap();
    let https = format!("https://127.0.0.1:{}", server.tcp_addr().unwrap().port());
    Fixture {
        _dir: dir,
        ca,
        server,
        https,
        unix: format!("unix://{}", sock.display()),
    }
}

async fn health_ok(ch: &MeshChannel) -> bool {
    tonic_health::pb::health_client::HealthClient::new(ch.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .is_ok()
}

#[tokio::test]
async fn allowed_roles_are_identified_and_others_denied() {
    let f = fixture().await;
    let readonly = client(&f.https, &f.ctx("ro", &LeafSpec::role("readonly"))).await;
    let reply = say(&readonly, "ok").await.unwrap();
    assert_eq!(reply.peer, "bigfleet://readonly");

    let cluster = client(&f.https, &f.ctx("cl", &LeafSpec::role("cluster/a"))).await;
    assert_refused(&cluster, Code::PermissionDenied, "bigfleet://cluster/a").await;
    // Health stays open to any verified caller.
    assert!(health_ok(&cluster).await);

    // The server name can be the DNS SAN too.
    let by_name = f.https.replace("127.0.0.1", "localhost");
    let admin = client(&by_name, &f.ctx("adm", &LeafSpec::role("admin"))).await;
    assert_eq!(say(&admin, "ok").await.unwrap().peer, "bigfleet://admin");
    f.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn certificates_with_zero_or_two_identities_are_denied_but_connect() {
    let f = fixture().await;
    let none = client(&f.https, &f.ctx("none", &LeafSpec::loopback("no identity"))).await;
    assert_refused(&none, Code::PermissionDenied, "found 0").await;
    assert!(health_ok(&none).await, "transport succeeded");

    let two = client(
        &f.https,
        &f.ctx(
            "two",
            &LeafSpec::role("readonly").with_uri("bigfleet://admin"),
        ),
    )
    .await;
    assert_refused(&two, Code::PermissionDenied, "found 2").await;
    f.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn callers_without_a_trusted_certificate_cannot_connect() {
    let f = fixture().await;
    // A client whose certificate comes from another CA (but which trusts ours).
    let dir = tempfile::tempdir().unwrap();
    let rogue = TestCa::new("rogue").unwrap();
    let rogue_cert = rogue.issue_role("admin").unwrap();
    let p = rogue
        .write_bundle(dir.path(), "rogue", &rogue_cert)
        .unwrap();
    let our_ca = f.ca.write_ca(dir.path()).unwrap();
    let rogue_ctx = TlsContext::load(&TlsFiles::new(p.cert, p.key, our_ca)).unwrap();
    let ch = bigfleet_mesh::dial_lazy(
        &f.https,
        &ChannelConfig::default().with_tls(Some(rogue_ctx.client_config().unwrap())),
        &no_retry(),
    )
    .unwrap();
    let r = say(&ch, "ok").await;
    assert!(
        matches!(code(&r), Code::Unavailable | Code::Unknown | Code::Internal),
        "{r:?}"
    );

    // A plaintext client on the mTLS port.
    let plain = bigfleet_mesh::dial_lazy(
        &f.https.replace("https", "http"),
        &ChannelConfig::default(),
        &no_retry(),
    )
    .unwrap();
    assert_ne!(code(&say(&plain, "ok").await), Code::Ok);

    // Asking for https without TLS configured is refused up front.
    assert!(bigfleet_mesh::dial_lazy(&f.https, &ChannelConfig::default(), &no_retry()).is_err());
    f.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_rate_limit_is_per_identity() {
    let f = fixture().await;
    let admin = client(&f.https, &f.ctx("adm", &LeafSpec::role("admin"))).await;
    let readonly = client(&f.https, &f.ctx("ro", &LeafSpec::role("readonly"))).await;
    assert_eq!(code(&say(&admin, "ok").await), Code::Ok);
    assert_eq!(code(&say(&admin, "ok").await), Code::Ok);
    assert_refused(&admin, Code::ResourceExhausted, "bigfleet://admin").await;
    // Another identity is unaffected.
    assert_eq!(code(&say(&readonly, "ok").await), Code::Ok);
    // A second connection with the same identity shares the bucket.
    let admin2 = client(&f.https, &f.ctx("adm2", &LeafSpec::role("admin"))).await;
    assert_eq!(code(&say(&admin2, "ok").await), Code::ResourceExhausted);
    f.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_unix_socket_of_an_mtls_server_stays_local_and_trusted() {
    let f = fixture().await;
    let ch = dial_once(&f.unix).await;
    assert_eq!(say(&ch, "ok").await.unwrap().peer, "local");
    f.server.shutdown().await.unwrap();
}
