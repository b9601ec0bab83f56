//! Real TLS handshakes between configs built by `TlsContext`, with certificates from testkit.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::{
    IdentityError, PeerIdentity, ReloadOutcome, TlsContext, TlsError, TlsFiles,
};
use bigfleet_testkit::{IssuedCert, LeafSpec, TestCa};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn files(dir: &std::path::Path, ca: &TestCa, stem: &str, cert: &IssuedCert) -> TlsFiles {
    let p = ca.write_bundle(dir, stem, cert).unwrap();
    TlsFiles::new(p.cert, p.key, p.ca)
}

fn ctx(files: &TlsFiles) -> TlsContext {
    TlsContext::load_with_check_interval(files, Duration::ZERO).unwrap()
}

/// A context holding a fresh leaf of `role` from `ca`, its files named `stem`.
fn role_ctx(dir: &std::path::Path, ca: &TestCa, stem: &str, role: &str) -> TlsContext {
    ctx(&files(dir, ca, stem, &ca.issue_role(role).unwrap()))
}

/// A handshake between a server and a client built from their contexts.
async fn connect(server: &TlsContext, client: &TlsContext) -> Handshake {
    handshake(
        server.server_config().unwrap(),
        client.client_config().unwrap(),
    )
    .await
}

/// Outcome of one handshake plus a one-byte echo (so TLS 1.3's deferred client-cert
/// verification has surfaced on both sides).
struct Handshake {
    /// The client's leaf as seen by the server, or the server's handshake error.
    server_saw: Result<Vec<u8>, String>,
    /// The server's leaf as seen by the client, or the client's error.
    client_saw: Result<Vec<u8>, String>,
}

impl Handshake {
    fn assert_refused_on_both_sides(&self) {
        assert!(self.server_saw.is_err(), "server saw {:?}", self.server_saw);
        assert!(self.client_saw.is_err(), "client saw {:?}", self.client_saw);
    }
}

/// A client config of one TLS `version` trusting `server`'s roots, before its own
/// certificate is chosen.
fn client_trusting(
    server: &TlsContext,
    version: &'static rustls::SupportedProtocolVersion,
) -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert> {
    rustls::ClientConfig::builder_with_provider(bigfleet_identity::crypto_provider())
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(Arc::clone(server.roots()))
}

async fn handshake(
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
) -> Handshake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = TlsAcceptor::from(server)
            .accept(tcp)
            .await
            .map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await.map_err(|e| e.to_string())?;
        tls.write_all(&b).await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec())
            .ok_or_else(|| "no client certificate".to_owned())?;
        Ok::<_, String>(leaf)
    });
    let client_saw = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = TlsConnector::from(client)
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"x").await.map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await.map_err(|e| e.to_string())?;
        let leaf = tls.get_ref().1.peer_certificates().unwrap()[0]
            .as_ref()
            .to_vec();
        Ok::<_, String>(leaf)
    }
    .await;
    let server_saw = tokio::time::timeout(Duration::from_secs(5), server_task)
        .await
        .expect("server side hung")
        .unwrap();
    Handshake {
        server_saw,
        client_saw,
    }
}

#[tokio::test]
async fn matching_san_is_accepted_and_identified() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let server_cert = ca.issue_role("shard/s1").unwrap();
    let client_cert = ca.issue_role("cluster/a").unwrap();
    let server = ctx(&files(dir.path(), &ca, "server", &server_cert));
    let client = ctx(&files(dir.path(), &ca, "client", &client_cert));
    assert_eq!(
        server.own_identity().unwrap(),
        PeerIdentity::Shard("s1".into())
    );

    let hs = connect(&server, &client).await;
    let seen = hs.server_saw.unwrap();
    assert_eq!(seen, client_cert.cert_der);
    assert_eq!(
        PeerIdentity::from_cert_der(&seen).unwrap(),
        PeerIdentity::Cluster("a".into())
    );
    assert_eq!(hs.client_saw.unwrap(), server_cert.cert_der);
}

#[tokio::test]
async fn zero_or_two_identity_sans_pass_transport_but_yield_no_identity() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let server = role_ctx(dir.path(), &ca, "server", "admin");
    let cases = [
        (LeafSpec::loopback("none"), 0),
        (
            LeafSpec::role("cluster/a").with_uri("bigfleet://cluster/b"),
            2,
        ),
        // A foreign URI SAN does not count; still zero bigfleet ones.
        (LeafSpec::loopback("spiffe").with_uri("spiffe://x/y"), 0),
    ];
    for (i, (spec, found)) in cases.into_iter().enumerate() {
        let cert = ca.issue(&spec).unwrap();
        let client = ctx(&files(dir.path(), &ca, &format!("c{i}"), &cert));
        let hs = connect(&server, &client).await;
        let leaf = hs.server_saw.expect("transport must succeed");
        assert_eq!(
            PeerIdentity::from_cert_der(&leaf),
            Err(IdentityError::SanCount { found })
        );
        let msg = PeerIdentity::from_cert_der(&leaf).unwrap_err().to_string();
        assert!(msg.contains("exactly one bigfleet:// URI SAN"), "{msg}");
    }
}

#[tokio::test]
async fn a_client_from_another_ca_fails_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let rogue = TestCa::new("rogue").unwrap();
    let server = role_ctx(dir.path(), &ca, "server", "admin");
    // The rogue client trusts our CA (so it accepts the server) but its own leaf is rogue.
    let rogue_files = {
        let p = rogue
            .write_bundle(dir.path(), "rogue", &rogue.issue_role("admin").unwrap())
            .unwrap();
        TlsFiles::new(p.cert, p.key, ca.write_ca(dir.path()).unwrap())
    };
    let client = ctx(&rogue_files);
    let hs = connect(&server, &client).await;
    let err = hs.server_saw.unwrap_err();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(hs.client_saw.is_err());
}

#[tokio::test]
async fn a_server_from_another_ca_is_refused_by_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let rogue = TestCa::new("rogue").unwrap();
    let rogue_server = role_ctx(dir.path(), &rogue, "rogue-server", "admin");
    let client = role_ctx(dir.path(), &ca, "client", "admin");
    let hs = connect(&rogue_server, &client).await;
    let err = hs.client_saw.unwrap_err();
    assert!(
        err.contains("UnknownIssuer") || err.to_lowercase().contains("issuer"),
        "{err}"
    );
    assert!(hs.server_saw.is_err());
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let server = role_ctx(dir.path(), &ca, "server", "admin");
    let client = client_trusting(&server, &rustls::version::TLS13).with_no_client_auth();
    let hs = handshake(server.server_config().unwrap(), Arc::new(client)).await;
    hs.assert_refused_on_both_sides();
}

#[tokio::test]
async fn tls12_clients_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let server = role_ctx(dir.path(), &ca, "server", "admin");
    let client_ctx = role_ctx(dir.path(), &ca, "client", "admin");
    let client = client_trusting(&server, &rustls::version::TLS12)
        .with_client_cert_resolver(client_ctx.reloader().clone());
    let hs = handshake(server.server_config().unwrap(), Arc::new(client)).await;
    hs.assert_refused_on_both_sides();
}

#[tokio::test]
async fn reload_picks_up_a_rotation_and_survives_a_half_written_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let first = ca.issue_role("shard/s1").unwrap();
    let server_files = files(dir.path(), &ca, "server", &first);
    let server = ctx(&server_files);
    let client = role_ctx(dir.path(), &ca, "client", "admin");
    let config = server.server_config().unwrap();
    let connect = || handshake(Arc::clone(&config), client.client_config().unwrap());

    assert_eq!(connect().await.client_saw.unwrap(), first.cert_der);
    assert!(matches!(
        server.reloader().check_now(),
        ReloadOutcome::Unchanged
    ));

    // Rotation: the next handshake (same ServerConfig) serves the new leaf.
    let second = ca.issue_role("shard/s1").unwrap();
    second
        .write_to(&server_files.cert, &server_files.key)
        .unwrap();
    assert_eq!(connect().await.client_saw.unwrap(), second.cert_der);

    // Half-written rotation: a truncated certificate. The previous pair keeps serving.
    let third = ca.issue_role("shard/s1").unwrap();
    let half = &third.cert_pem[..third.cert_pem.len() / 2];
    std::fs::write(&server_files.cert, half).unwrap();
    assert!(matches!(
        server.reloader().check_now(),
        ReloadOutcome::Failed(TlsError::BadPem { .. })
    ));
    assert_eq!(connect().await.client_saw.unwrap(), second.cert_der);
    // The same broken files are not re-parsed on every check.
    assert!(matches!(
        server.reloader().check_now(),
        ReloadOutcome::Unchanged
    ));

    // New cert written, old key still there: a mismatched pair is refused too.
    std::fs::write(&server_files.cert, &third.cert_pem).unwrap();
    assert!(matches!(
        server.reloader().check_now(),
        ReloadOutcome::Failed(TlsError::KeyPair { .. })
    ));
    assert_eq!(connect().await.client_saw.unwrap(), second.cert_der);

    // The key lands: the rotation completes.
    std::fs::write(&server_files.key, &third.key_pem).unwrap();
    assert_eq!(connect().await.client_saw.unwrap(), third.cert_der);

    // Files vanishing (mid-swap) keep the current pair.
    std::fs::remove_file(&server_files.cert).unwrap();
    assert!(matches!(
        server.reloader().check_now(),
        ReloadOutcome::Unchanged
    ));
    assert_eq!(connect().await.client_saw.unwrap(), third.cert_der);
}

#[tokio::test]
async fn client_certificates_reload_too() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let server = role_ctx(dir.path(), &ca, "server", "admin");
    let first = ca.issue_role("cluster/a").unwrap();
    let client_files = files(dir.path(), &ca, "client", &first);
    let client = ctx(&client_files);
    let client_config = client.client_config().unwrap();
    let hs = handshake(server.server_config().unwrap(), Arc::clone(&client_config)).await;
    assert_eq!(hs.server_saw.unwrap(), first.cert_der);

    let second = ca.issue_role("cluster/a").unwrap();
    second
        .write_to(&client_files.cert, &client_files.key)
        .unwrap();
    let hs = handshake(server.server_config().unwrap(), client_config).await;
    assert_eq!(hs.server_saw.unwrap(), second.cert_der);
}

#[test]
fn startup_fails_on_missing_or_invalid_files() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let good = files(dir.path(), &ca, "good", &ca.issue_role("admin").unwrap());

    let missing = TlsFiles::new(dir.path().join("nope.crt"), &good.key, &good.ca);
    assert!(matches!(
        TlsContext::load(&missing),
        Err(TlsError::Read { .. })
    ));

    let empty_ca = dir.path().join("empty-ca.crt");
    std::fs::write(&empty_ca, "").unwrap();
    let bad_ca = TlsFiles::new(&good.cert, &good.key, &empty_ca);
    assert!(matches!(
        TlsContext::load(&bad_ca),
        Err(TlsError::BadPem { .. })
    ));

    let other = ca.issue_role("admin").unwrap();
    let other_key = dir.path().join("other.key");
    std::fs::write(&other_key, &other.key_pem).unwrap();
    let mismatched = TlsFiles::new(&good.cert, &other_key, &good.ca);
    assert!(matches!(
        TlsContext::load(&mismatched),
        Err(TlsError::KeyPair { .. })
    ));

    assert!(TlsContext::load(&good).is_ok());
}
