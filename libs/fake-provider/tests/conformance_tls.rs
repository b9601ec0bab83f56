//! `provider-conformance` against a provider that requires mTLS: with the three `--tls-*`
//! flags it dials as a shard does and the suite passes; without them an `https://` target
//! is refused before anything is sent, and a partial flag set is an error naming what is
//! missing.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use bigfleet_fake_provider::{FakeProvider, FakeProviderService};
use bigfleet_identity::TlsContext;
use bigfleet_identity::ca::{CertificateAuthority, LeafRequest};
use bigfleet_mesh::{AuthzPolicy, MeshServer, RunningServer, ServerStackConfig};

/// The fake served behind the mesh's server stack with mTLS (client certificates required).
async fn tls_provider(dir: &Path) -> RunningServer {
    let ca = CertificateAuthority::create("conformance ca", std::time::Duration::from_secs(3600))
        .unwrap();
    let server = ca
        .issue_bundle(
            &LeafRequest::new("provider/fake").unwrap().with_loopback(),
            dir,
            "provider",
        )
        .unwrap();
    ca.issue_bundle(
        &LeafRequest::new("shard/conformance")
            .unwrap()
            .with_loopback(),
        dir,
        "client",
    )
    .unwrap();
    let tls = TlsContext::load(&server).unwrap().server_config().unwrap();
    MeshServer::new(
        "tls-provider",
        ServerStackConfig {
            authz: Arc::new(AuthzPolicy::allow_any_identity()),
            ..ServerStackConfig::default()
        },
    )
    .tcp(SocketAddr::from(([127, 0, 0, 1], 0)))
    .tls(Some(tls))
    .add_service(FakeProviderService::new(Arc::new(FakeProvider::builtin())))
    .start()
    .await
    .unwrap()
}

async fn conformance(args: &[String]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_provider-conformance"))
        .args(args)
        .env_remove("BIGFLEET_PROVIDER_TARGET")
        .env_remove("BIGFLEET_TLS_CERT")
        .env_remove("BIGFLEET_TLS_KEY")
        .env_remove("BIGFLEET_TLS_CA")
        .output()
        .await
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_runs_over_mtls_and_never_falls_back_to_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let server = tls_provider(dir.path()).await;
    let target = format!("https://{}", server.tcp_addr().unwrap());
    let file = |name: &str| dir.path().join(name).display().to_string();
    let args = vec!["--target".to_owned(), target.clone()];
    let tls = [
        "--tls-cert".to_owned(),
        file("client.crt"),
        "--tls-key".into(),
        file("client.key"),
        "--tls-ca".into(),
        file("ca.crt"),
    ];

    let out = conformance(&[args.clone(), tls.to_vec()].concat()).await;
    assert!(out.status.success(), "{}", text(&out));
    let report = text(&out);
    let summary = report.lines().last().unwrap_or_default();
    assert!(
        summary.ends_with(" passed, 0 failed") && !summary.starts_with("0 "),
        "{report}"
    );

    // No flags: an https:// target is refused, nothing is sent in plaintext.
    let out = conformance(&args).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("requires tls"), "{}", text(&out));

    // Half the flags: an error naming the missing ones, not a plaintext run.
    let out = conformance(&[args.clone(), tls[..2].to_vec()].concat()).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("--tls-key") && text(&out).contains("--tls-ca"),
        "{}",
        text(&out)
    );
    server.shutdown().await.unwrap();
}
