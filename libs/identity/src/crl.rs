//! Certificate revocation (`--tls-crl`): peer certificates are checked against a PEM file
//! of CRLs that is re-read when it changes, on both sides of every connection.
//!
//! rustls checks CRLs during the handshake only, so a revocation reaches connections made
//! after the reload; a connection that is already up keeps its identity until the server's
//! maximum connection age sends it away (`bigfleet-mesh`'s `ServerLimits`), which bounds how
//! long a revoked certificate keeps access.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::DistinguishedName;
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::TlsError;

/// Reads every CRL in a PEM file. An empty file is valid (nothing revoked).
pub fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            path: path.to_path_buf(),
            reason: format!("crl: {e}"),
        })
}

struct Verifiers {
    client: Arc<dyn ClientCertVerifier>,
    server: Arc<WebPkiServerVerifier>,
}

/// The CRL file and the verifiers built from its current content, shared by a process's
/// server and client configs.
pub struct CrlVerifiers {
    path: PathBuf,
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    hints: Vec<DistinguishedName>,
    current: ArcSwap<Verifiers>,
    /// Content last loaded and when the file was last looked at.
    seen: Mutex<(Vec<u8>, Instant)>,
    check_interval: Duration,
}

impl std::fmt::Debug for CrlVerifiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrlVerifiers")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn build(
    roots: &Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
    crls: Vec<CertificateRevocationListDer<'static>>,
) -> Result<Verifiers, TlsError> {
    let client =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(roots), Arc::clone(provider))
            .with_crls(crls.clone())
            // The mesh CA issues leaves directly; intermediates (if any) are the CA operator's.
            .only_check_end_entity_revocation()
            .build()
            .map_err(|e| TlsError::Config(format!("crl: {e}")))?;
    let server =
        WebPkiServerVerifier::builder_with_provider(Arc::clone(roots), Arc::clone(provider))
            .with_crls(crls)
            .only_check_end_entity_revocation()
            .build()
            .map_err(|e| TlsError::Config(format!("crl: {e}")))?;
    Ok(Verifiers { client, server })
}

impl CrlVerifiers {
    /// Loads the CRL file now (a startup error if it does not parse).
    pub fn load(
        path: &Path,
        roots: Arc<RootCertStore>,
        provider: Arc<CryptoProvider>,
        check_interval: Duration,
    ) -> Result<Arc<Self>, TlsError> {
        let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let verifiers = build(&roots, &provider, read_crls(path)?)?;
        Ok(Arc::new(Self {
            path: path.to_path_buf(),
            hints: roots.subjects(),
            roots,
            provider,
            current: ArcSwap::from_pointee(verifiers),
            seen: Mutex::new((bytes, Instant::now())),
            check_interval,
        }))
    }

    /// Re-reads the file if the check interval has passed and its content changed. A file
    /// that no longer parses keeps the previous list (logged): failing open to "nothing
    /// revoked" would be the wrong way round, failing closed would lock out the whole mesh.
    pub fn maybe_reload(&self) {
        let Some(mut seen) = self.seen.try_lock() else {
            return;
        };
        if seen.1.elapsed() < self.check_interval {
            return;
        }
        seen.1 = Instant::now();
        let Ok(bytes) = std::fs::read(&self.path) else {
            tracing::warn!(path = %self.path.display(), "crl file unreadable; keeping the previous list");
            return;
        };
        if bytes == seen.0 {
            return;
        }
        match read_crls(&self.path).and_then(|crls| build(&self.roots, &self.provider, crls)) {
            Ok(v) => {
                self.current.store(Arc::new(v));
                seen.0 = bytes;
                tracing::info!(path = %self.path.display(), "crl reloaded");
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "crl file changed but does not load; keeping the previous list");
            }
        }
    }

    fn algorithms(&self) -> &rustls::crypto::WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }

    /// A rustls client-certificate verifier (server side) that follows the file.
    pub fn client_verifier(self: &Arc<Self>) -> Arc<dyn ClientCertVerifier> {
        Arc::new(ReloadingClientVerifier(Arc::clone(self)))
    }

    /// A rustls server-certificate verifier (client side) that follows the file.
    pub fn server_verifier(self: &Arc<Self>) -> Arc<dyn ServerCertVerifier> {
        Arc::new(ReloadingServerVerifier(Arc::clone(self)))
    }
}

/// The handshake-signature methods, the same in both verifier traits: they do not depend on
/// the CRLs, so they are checked with the provider's algorithms, as the webpki verifiers
/// themselves do. Expands inside an `impl` for a newtype over `Arc<CrlVerifiers>`.
macro_rules! handshake_signature_methods {
    () => {
        handshake_signature_methods!(verify_tls12_signature, verify_tls13_signature);

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.algorithms().supported_schemes()
        }
    };
    // Each method has the name of the rustls function that checks it.
    ($($method:ident),+) => {
        $(
            fn $method(
                &self,
                message: &[u8],
                cert: &CertificateDer<'_>,
                dss: &DigitallySignedStruct,
            ) -> Result<HandshakeSignatureValid, rustls::Error> {
                rustls::crypto::$method(message, cert, dss, self.0.algorithms())
            }
        )+
    };
}

#[derive(Debug)]
struct ReloadingClientVerifier(Arc<CrlVerifiers>);

impl ClientCertVerifier for ReloadingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.0.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.maybe_reload();
        self.0
            .current
            .load()
            .client
            .verify_client_cert(end_entity, intermediates, now)
    }

    handshake_signature_methods!();
}

#[derive(Debug)]
struct ReloadingServerVerifier(Arc<CrlVerifiers>);

impl ServerCertVerifier for ReloadingServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0.maybe_reload();
        self.0.current.load().server.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    handshake_signature_methods!();
}
