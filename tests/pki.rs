//! `bigfleet pki install-secrets` against a fake Kubernetes API server: axum over TLS on
//! 127.0.0.1:0 (certificate from the testkit CA), storing Secrets in memory with
//! resourceVersions, AlreadyExists/Conflict answers and bearer-token checks like the real one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bigfleet::pki::kube::KubeClient;
use bigfleet::pki::{
    InstallReport, InstallSecretsArgs, Lifetimes, MANAGED_BY, PkiError, Plan, SecretAction,
    install_secrets,
};
use bigfleet_identity::PeerIdentity;
use bigfleet_identity::ca::{CertInfo, CertificateAuthority, LeafRequest, key_matches_cert};
use bigfleet_testkit::{LeafSpec, TestCa};
use clap::Parser;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tower::ServiceExt;

const TOKEN: &str = "test-token";
const NS: &str = "bigfleet-system";

#[derive(Default)]
struct Api {
    secrets: BTreeMap<(String, String), Value>,
    next_rv: u64,
    /// (method, path) of every authorised request.
    requests: Vec<(String, String)>,
}

type Shared = Arc<Mutex<Api>>;

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

fn authorised(headers: &HeaderMap) -> Result<(), Box<Response>> {
    match headers.get("authorization").and_then(|v| v.to_str().ok()) {
        Some(v) if v == format!("Bearer {TOKEN}") => Ok(()),
        _ => Err(Box::new(status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized".into(),
        ))),
    }
}

/// An authorised call: the API's state, locked, with the call recorded in its log; an
/// unauthorised one gets the server's 401.
fn admit<'a>(
    api: &'a Shared,
    headers: &HeaderMap,
    method: &str,
    path: String,
) -> Result<parking_lot::MutexGuard<'a, Api>, Box<Response>> {
    authorised(headers)?;
    let mut api = api.lock();
    api.requests.push((method.into(), path));
    Ok(api)
}

fn not_found(name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("secrets \"{name}\" not found"),
    )
}

/// Stores `secret` under `key` with the next resourceVersion (written into `secret`).
fn store(api: &mut Api, key: (String, String), secret: &mut Value) {
    api.next_rv += 1;
    secret["metadata"]["resourceVersion"] = json!(api.next_rv.to_string());
    api.secrets.insert(key, secret.clone());
}

/// What the API server checks of a kubernetes.io/tls Secret.
fn invalid(secret: &Value) -> Option<String> {
    if secret["type"] == "kubernetes.io/tls" {
        for key in ["tls.crt", "tls.key"] {
            if !secret["data"][key].is_string() {
                return Some(format!("data[{key}]: Required value"));
            }
        }
    }
    None
}

/// [`admit`] for a write: the body must also be a valid Secret.
fn admit_write<'a>(
    api: &'a Shared,
    headers: &HeaderMap,
    method: &str,
    path: String,
    secret: &Value,
) -> Result<parking_lot::MutexGuard<'a, Api>, Box<Response>> {
    let api = admit(api, headers, method, path)?;
    match invalid(secret) {
        Some(why) => Err(Box::new(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            why,
        ))),
        None => Ok(api),
    }
}

async fn get_secret(
    State(api): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let api = match admit(&api, &headers, "GET", format!("{ns}/secrets/{name}")) {
        Ok(api) => api,
        Err(r) => return *r,
    };
    match api.secrets.get(&(ns, name.clone())) {
        Some(s) => axum::Json(s.clone()).into_response(),
        None => not_found(&name),
    }
}

async fn create_secret(
    State(api): State<Shared>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    axum::Json(mut secret): axum::Json<Value>,
) -> Response {
    let name = secret["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let path = format!("{ns}/secrets/{name}");
    let mut api = match admit_write(&api, &headers, "POST", path, &secret) {
        Ok(api) => api,
        Err(r) => return *r,
    };
    let key = (ns, name.clone());
    if api.secrets.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("secrets \"{name}\" already exists"),
        );
    }
    store(&mut api, key, &mut secret);
    (StatusCode::CREATED, axum::Json(secret)).into_response()
}

async fn replace_secret(
    State(api): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    axum::Json(mut secret): axum::Json<Value>,
) -> Response {
    let path = format!("{ns}/secrets/{name}");
    let mut api = match admit_write(&api, &headers, "PUT", path, &secret) {
        Ok(api) => api,
        Err(r) => return *r,
    };
    let key = (ns, name.clone());
    let Some(stored) = api.secrets.get(&key) else {
        return not_found(&name);
    };
    if stored["metadata"]["resourceVersion"] != secret["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified".into(),
        );
    }
    store(&mut api, key, &mut secret);
    axum::Json(secret).into_response()
}

struct FakeApiServer {
    addr: SocketAddr,
    ca_pem: String,
    api: Shared,
}

impl FakeApiServer {
    async fn start() -> Self {
        let ca = TestCa::new("fake kube-apiserver ca").unwrap();
        let leaf = ca.issue(&LeafSpec::loopback("kube-apiserver")).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let mut tls =
            rustls::ServerConfig::builder_with_provider(bigfleet_identity::crypto_provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let api: Shared = Arc::default();
        let router = Router::new()
            .route("/api/v1/namespaces/{ns}/secrets", post(create_secret))
            .route(
                "/api/v1/namespaces/{ns}/secrets/{name}",
                get(get_secret).put(replace_secret),
            )
            .with_state(Arc::clone(&api));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, router) = (acceptor.clone(), router.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |req| router.clone().oneshot(req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            ca_pem: ca.ca_pem(),
            api,
        }
    }

    fn client(&self, token: &str) -> KubeClient {
        KubeClient::new(
            "127.0.0.1",
            self.addr.port(),
            self.ca_pem.as_bytes(),
            token,
            Duration::from_secs(10),
        )
        .unwrap()
    }

    fn secret(&self, name: &str) -> Option<Value> {
        self.api
            .lock()
            .secrets
            .get(&(NS.to_owned(), name.to_owned()))
            .cloned()
    }

    fn put(&self, secret: Value) {
        let name = secret["metadata"]["name"].as_str().unwrap().to_owned();
        let mut api = self.api.lock();
        api.next_rv += 1;
        let mut secret = secret;
        secret["metadata"]["resourceVersion"] = json!(api.next_rv.to_string());
        api.secrets.insert((NS.to_owned(), name), secret);
    }

    /// Requests other than GET since the last call.
    fn writes(&self) -> Vec<(String, String)> {
        let mut api = self.api.lock();
        std::mem::take(&mut api.requests)
            .into_iter()
            .filter(|(m, _)| m != "GET")
            .collect()
    }
}

fn text(secret: &Value, key: &str) -> String {
    String::from_utf8(
        BASE64
            .decode(secret["data"][key].as_str().unwrap())
            .unwrap(),
    )
    .unwrap()
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    a: InstallSecretsArgs,
}

fn plan(extra: &[&str]) -> Plan {
    let mut argv = vec![
        "x",
        "--prefix",
        "bf",
        "--label",
        "app.kubernetes.io/instance=bf",
    ];
    argv.extend_from_slice(extra);
    Plan::new(&Args::try_parse_from(argv).unwrap().a, NS).unwrap()
}

const FULL: &[&str] = &[
    "--coordinators=3",
    "--shards=2",
    "--execute-shards=2",
    "--inspect-secret=bf-inspect-tls",
];

fn lifetimes() -> Lifetimes {
    Lifetimes {
        ca: Duration::from_secs(10 * 365 * 24 * 3600),
        leaf: Duration::from_secs(365 * 24 * 3600),
        renew_before: Duration::from_secs(30 * 24 * 3600),
    }
}

async fn install(server: &FakeApiServer, plan: &Plan, lifetimes: Lifetimes) -> InstallReport {
    install_secrets(&server.client(TOKEN), plan, lifetimes)
        .await
        .unwrap()
}

/// Every role Secret of `report` had `action`.
fn assert_every_secret(report: &InstallReport, action: SecretAction) {
    assert!(
        report.secrets.iter().all(|s| s.action == action),
        "{report:?}"
    );
}

fn actions(report: &InstallReport) -> Vec<(String, SecretAction)> {
    report
        .secrets
        .iter()
        .map(|s| (s.name.clone(), s.action))
        .collect()
}

/// Every planned Secret holds a leaf for its identity and DNS names, issued by the CA in
/// the CA Secret, with a matching key and that CA as ca.crt.
fn assert_issued(server: &FakeApiServer, plan: &Plan) -> CertificateAuthority {
    let ca_secret = server.secret(&plan.ca_secret).expect("the CA Secret");
    assert_eq!(ca_secret["type"], "kubernetes.io/tls");
    let ca =
        CertificateAuthority::from_pem(&text(&ca_secret, "tls.crt"), &text(&ca_secret, "tls.key"))
            .expect("a usable CA");
    if ca_secret["data"]["ca.crt"].is_string() {
        assert_eq!(text(&ca_secret, "ca.crt"), ca.cert_pem());
    }
    for planned in &plan.secrets {
        let s = server
            .secret(&planned.name)
            .unwrap_or_else(|| panic!("{} missing", planned.name));
        assert_eq!(s["type"], "kubernetes.io/tls", "{}", planned.name);
        assert_eq!(s["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
        assert_eq!(s["metadata"]["labels"]["app.kubernetes.io/instance"], "bf");
        assert_eq!(
            s["metadata"]["annotations"]["bigfleet/identity"],
            planned.identity
        );
        assert_eq!(text(&s, "ca.crt"), ca.cert_pem(), "{}", planned.name);
        let cert = der(&text(&s, "tls.crt"));
        let info = CertInfo::from_der(&cert).unwrap();
        assert_eq!(
            info.identity_uris,
            vec![planned.identity.clone()],
            "{}",
            planned.name
        );
        assert_eq!(info.dns_names, planned.dns_names, "{}", planned.name);
        assert_eq!(
            PeerIdentity::from_cert_der(&cert).unwrap().to_string(),
            planned.identity
        );
        assert!(
            key_matches_cert(&cert, &text(&s, "tls.key")),
            "{}",
            planned.name
        );
        ca.verify(&cert).unwrap();
    }
    ca
}

#[tokio::test]
async fn creates_the_ca_once_and_every_role_secret_then_reuses_them() {
    let server = FakeApiServer::start().await;
    let plan = plan(FULL);
    assert_eq!(plan.secrets.len(), 3 + 2 + 2 + 1);

    let first = install(&server, &plan, lifetimes()).await;
    assert_eq!(first.ca.action, SecretAction::Created);
    assert_every_secret(&first, SecretAction::Created);
    let ca = assert_issued(&server, &plan);
    let ca_secret = server.secret("bf-ca").unwrap();
    assert_eq!(text(&ca_secret, "ca.crt"), ca.cert_pem());
    assert_eq!(ca_secret["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
    let identities: Vec<String> = plan.secrets.iter().map(|s| s.identity.clone()).collect();
    assert!(identities.contains(&"bigfleet://coordinator/bf-coordinator-2".to_owned()));
    assert!(identities.contains(&"bigfleet://shard/bf-shard-1/execute".to_owned()));
    let before: BTreeMap<String, Value> = plan
        .secrets
        .iter()
        .map(|s| (s.name.clone(), server.secret(&s.name).unwrap()))
        .collect();
    server.writes();

    // Second run: the CA is read, nothing is written.
    let second = install(&server, &plan, lifetimes()).await;
    assert_eq!(second.ca.action, SecretAction::Reused);
    assert_eq!(second.ca_not_after, first.ca_not_after);
    assert_every_secret(&second, SecretAction::Unchanged);
    assert_eq!(server.writes(), vec![]);
    for (name, secret) in &before {
        assert_eq!(&server.secret(name).unwrap(), secret);
    }

    // Scaling shards up adds the new ordinal's Secret from the same CA.
    let bigger = self::plan(&[
        "--coordinators=3",
        "--shards=3",
        "--inspect-secret=bf-inspect-tls",
    ]);
    let third = install(&server, &bigger, lifetimes()).await;
    assert_eq!(third.ca.action, SecretAction::Reused);
    assert_eq!(
        actions(&third)
            .into_iter()
            .filter(|(_, a)| *a != SecretAction::Unchanged)
            .collect::<Vec<_>>(),
        vec![("bf-shard-tls-2".to_owned(), SecretAction::Created)]
    );
    assert_eq!(assert_issued(&server, &bigger).cert_pem(), ca.cert_pem());
    server.writes();

    // Leaves inside the renewal window are re-issued in place (conditional PUT), still from
    // the same CA.
    let renew = Lifetimes {
        renew_before: Duration::from_secs(400 * 24 * 3600),
        ..lifetimes()
    };
    let fourth = install(&server, &plan, renew).await;
    assert_eq!(fourth.ca.action, SecretAction::Reused);
    assert_every_secret(&fourth, SecretAction::Renewed);
    assert!(
        fourth.secrets[0]
            .reason
            .as_deref()
            .unwrap()
            .starts_with("expires ")
    );
    assert!(server.writes().iter().all(|(m, _)| m == "PUT"));
    assert_eq!(assert_issued(&server, &plan).cert_pem(), ca.cert_pem());
    for (name, secret) in &before {
        assert_ne!(
            text(&server.secret(name).unwrap(), "tls.crt"),
            text(secret, "tls.crt")
        );
    }
}

#[tokio::test]
async fn stale_or_tampered_leaves_are_reissued() {
    let server = FakeApiServer::start().await;
    let plan = plan(&["--shards=2", "--inspect-secret=bf-inspect-tls"]);
    install(&server, &plan, lifetimes()).await;

    // shard-0: a certificate for the right identity from another CA (ca.crt left alone).
    let mut s0 = server.secret("bf-shard-tls-0").unwrap();
    let stranger = CertificateAuthority::create("stranger", Duration::from_secs(3600)).unwrap();
    let forged = stranger
        .issue(
            &LeafRequest::new("shard/bf-shard-0")
                .unwrap()
                .with_dns_name(&plan.secrets[0].dns_names[0]),
        )
        .unwrap();
    s0["data"]["tls.crt"] = json!(BASE64.encode(&forged.cert_pem));
    s0["data"]["tls.key"] = json!(BASE64.encode(&forged.key_pem));
    // Someone else's label survives the renewal.
    s0["metadata"]["labels"]["team"] = json!("fleet");
    server.put(s0);
    // shard-1: the key of another certificate.
    let mut s1 = server.secret("bf-shard-tls-1").unwrap();
    s1["data"]["tls.key"] = json!(BASE64.encode(&forged.key_pem));
    server.put(s1);

    let report = install(&server, &plan, lifetimes()).await;
    let by_name: BTreeMap<String, (SecretAction, Option<String>)> = report
        .secrets
        .iter()
        .map(|s| (s.name.clone(), (s.action, s.reason.clone())))
        .collect();
    let (action, reason) = &by_name["bf-shard-tls-0"];
    assert_eq!(*action, SecretAction::Renewed);
    assert!(
        reason.as_deref().unwrap().contains("does not verify"),
        "{reason:?}"
    );
    let (action, reason) = &by_name["bf-shard-tls-1"];
    assert_eq!(*action, SecretAction::Renewed);
    assert!(reason.as_deref().unwrap().contains("tls.key"), "{reason:?}");
    assert_eq!(by_name["bf-inspect-tls"].0, SecretAction::Unchanged);
    assert_issued(&server, &plan);
    assert_eq!(
        server.secret("bf-shard-tls-0").unwrap()["metadata"]["labels"]["team"],
        "fleet"
    );

    // Different expected DNS names (say, the Secret was copied from another namespace):
    // re-issued.
    let mut moved = plan.clone();
    moved.secrets[0].dns_names = vec!["bf-shard-0.bf-shard-headless.other.svc".into()];
    let report = install(&server, &moved, lifetimes()).await;
    assert_eq!(report.secrets[0].action, SecretAction::Renewed);
    assert!(
        report.secrets[0]
            .reason
            .as_deref()
            .unwrap()
            .starts_with("DNS names")
    );
}

#[tokio::test]
async fn foreign_secrets_are_never_overwritten_and_a_users_ca_is_used() {
    let server = FakeApiServer::start().await;
    // The user brought a CA (no managed-by label): it is used, not replaced.
    let own = CertificateAuthority::create("my ca", Duration::from_secs(3600 * 24 * 30)).unwrap();
    server.put(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "bf-ca", "namespace": NS},
        "data": {"tls.crt": BASE64.encode(own.cert_pem()), "tls.key": BASE64.encode(own.key_pem())},
    }));
    // And a Secret of their own under a role Secret's name.
    let foreign = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "bf-inspect-tls", "namespace": NS},
        "data": {"x": BASE64.encode("mine")},
    });
    server.put(foreign);
    let stored = server.secret("bf-inspect-tls").unwrap();

    let plan = plan(&["--shards=1", "--inspect-secret=bf-inspect-tls"]);
    let err = install_secrets(&server.client(TOKEN), &plan, lifetimes())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PkiError::Secret { .. }), "{msg}");
    assert!(
        msg.contains("bf-inspect-tls") && msg.contains("refusing to overwrite"),
        "{msg}"
    );
    assert_eq!(server.secret("bf-inspect-tls").unwrap(), stored);

    // Without the clash, everything is issued from the user's CA; its short life is warned about.
    let plan = self::plan(&["--shards=1"]);
    let report = install(&server, &plan, lifetimes()).await;
    assert_eq!(report.ca.action, SecretAction::Reused);
    assert_eq!(report.warnings.len(), 1, "{report:?}");
    assert!(report.warnings[0].contains("never rotated automatically"));
    assert_eq!(assert_issued(&server, &plan).cert_pem(), own.cert_pem());
}

#[tokio::test]
async fn a_broken_ca_secret_stops_the_run_and_is_left_alone() {
    let server = FakeApiServer::start().await;
    let broken = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "bf-ca", "namespace": NS, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "data": {"tls.crt": BASE64.encode("garbage"), "tls.key": BASE64.encode("garbage")},
    });
    server.put(broken);
    let stored = server.secret("bf-ca").unwrap();
    let err = install_secrets(&server.client(TOKEN), &plan(&["--shards=1"]), lifetimes())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bf-ca") && err.contains("never replaced automatically"),
        "{err}"
    );
    assert_eq!(server.secret("bf-ca").unwrap(), stored);
    assert!(server.secret("bf-shard-tls-0").is_none());
    assert_eq!(server.writes(), vec![]);
}

#[tokio::test]
async fn api_errors_carry_the_servers_message() {
    let server = FakeApiServer::start().await;
    let err = install_secrets(&server.client("wrong"), &plan(&["--shards=1"]), lifetimes())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("HTTP 401") && err.contains("Unauthorized"),
        "{err}"
    );

    // Nothing listening: a transport error naming the address, within the timeout.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let client = KubeClient::new(
        "127.0.0.1",
        closed,
        server.ca_pem.as_bytes(),
        TOKEN,
        Duration::from_secs(5),
    )
    .unwrap();
    let err = client.get_secret(NS, "x").await.unwrap_err().to_string();
    assert!(err.contains(&format!("127.0.0.1:{closed}")), "{err}");
}

/// The real binary, configured the in-cluster way: KUBERNETES_SERVICE_HOST/PORT and a
/// service-account directory with token, ca.crt and namespace.
#[tokio::test]
async fn the_cli_installs_secrets_in_cluster_style() {
    let server = FakeApiServer::start().await;
    let sa = tempfile::tempdir().unwrap();
    std::fs::write(sa.path().join("token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(sa.path().join("ca.crt"), &server.ca_pem).unwrap();
    std::fs::write(sa.path().join("namespace"), NS).unwrap();
    let (sa_dir, port) = (sa.path().to_path_buf(), server.addr.port());
    let run = move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_bigfleet"))
            .args([
                "pki",
                "install-secrets",
                "--prefix=bf",
                "--coordinators=1",
                "--shards=1",
                "-o",
                "json",
            ])
            .arg(format!("--service-account-dir={}", sa_dir.display()))
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", port.to_string())
            .env_remove("BIGFLEET_TLS_CERT")
            .env_remove("BIGFLEET_TLS_KEY")
            .env_remove("BIGFLEET_TLS_CA")
            .output()
            .unwrap()
    };
    let out = tokio::task::spawn_blocking(run.clone()).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["namespace"], NS);
    assert_eq!(report["ca"]["action"], "created");
    assert_eq!(report["secrets"][0]["name"], "bf-coordinator-tls-0");
    assert_eq!(report["secrets"][0]["action"], "created");
    assert!(server.secret("bf-shard-tls-0").is_some());

    let out = tokio::task::spawn_blocking(run.clone()).await.unwrap();
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ca"]["action"], "reused");
    assert_eq!(report["secrets"][1]["action"], "unchanged");

    // Outside a pod the error says so.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bigfleet"))
        .args(["pki", "install-secrets", "--prefix=bf", "--namespace=x"])
        .arg(format!("--service-account-dir={}", sa.path().display()))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("KUBERNETES_SERVICE_HOST"));
}

#[test]
fn pki_issue_writes_an_admin_bundle_from_a_ca_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::create("chart ca", Duration::from_secs(3600 * 24)).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();
    std::fs::write(dir.path().join("ca.key"), ca.key_pem()).unwrap();
    let out_dir = dir.path().join("admin");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bigfleet"))
        .args(["pki", "issue", "--identity=admin", "--validity=1h"])
        .arg(format!("--ca-cert={}", dir.path().join("ca.crt").display()))
        .arg(format!("--ca-key={}", dir.path().join("ca.key").display()))
        .arg(format!("--out-dir={}", out_dir.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cert = std::fs::read_to_string(out_dir.join("admin.crt")).unwrap();
    assert_eq!(
        PeerIdentity::from_cert_der(&der(&cert)).unwrap(),
        PeerIdentity::Admin
    );
    ca.verify(&der(&cert)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out_dir.join("admin.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        std::fs::read_to_string(out_dir.join("ca.crt")).unwrap(),
        ca.cert_pem()
    );
}

#[test]
fn pki_crl_revokes_the_named_certificates_only() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::create("crl ca", Duration::from_secs(3600 * 24)).unwrap();
    let (ca_crt, ca_key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    std::fs::write(&ca_crt, ca.cert_pem()).unwrap();
    std::fs::write(&ca_key, ca.key_pem()).unwrap();
    let issue = |id: &str| {
        let leaf = ca
            .issue(&bigfleet_identity::ca::LeafRequest::new(id).unwrap())
            .unwrap();
        let path = dir.path().join(format!("{}.crt", id.replace('/', "-")));
        std::fs::write(&path, &leaf.cert_pem).unwrap();
        (path, leaf.cert_der)
    };
    let (revoked_path, revoked_der) = issue("cluster/leaked");
    let (_, kept_der) = issue("cluster/fine");
    let out = dir.path().join("ca.crl");
    let run = |extra: &[String]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_bigfleet"))
            .args(["pki", "crl"])
            .arg(format!("--ca-cert={}", ca_crt.display()))
            .arg(format!("--ca-key={}", ca_key.display()))
            .arg(format!("--out={}", out.display()))
            .args(extra)
            .output()
            .unwrap()
    };
    let ok = run(&[format!("--revoke={}", revoked_path.display())]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let crls = bigfleet_identity::read_crls(&out).unwrap();
    assert_eq!(crls.len(), 1);
    let serial = |der: &[u8]| {
        x509_parser::parse_x509_certificate(der)
            .unwrap()
            .1
            .raw_serial()
            .to_vec()
    };
    let (_, crl) = x509_parser::parse_x509_crl(crls[0].as_ref()).unwrap();
    let listed: Vec<Vec<u8>> = crl
        .iter_revoked_certificates()
        .map(|r| r.raw_serial().to_vec())
        .collect();
    assert_eq!(listed, vec![serial(&revoked_der)]);
    assert!(!listed.contains(&serial(&kept_der)));
    // A certificate of another CA is refused, not silently listed.
    let other = CertificateAuthority::create("other", Duration::from_secs(3600)).unwrap();
    let foreign = other
        .issue(&bigfleet_identity::ca::LeafRequest::new("admin").unwrap())
        .unwrap();
    let foreign_path = dir.path().join("foreign.crt");
    std::fs::write(&foreign_path, &foreign.cert_pem).unwrap();
    let bad = run(&[format!("--revoke={}", foreign_path.display())]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a certificate of this CA"));
}
