//! rustls server and client configs for mutual TLS between bigfleet processes.

use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::crl::CrlVerifiers;
use crate::reload::{CertReloader, read_certs};
use crate::{IdentityError, PeerIdentity, TlsError, TlsFiles};

/// ALPN for gRPC: HTTP/2 is mandatory, and gRPC clients (ours, grpc-go/grpcurl) offer `h2`.
const ALPN_H2: &[u8] = b"h2";
/// Offered by servers as a fallback so a browser can still reach an axum page over TLS.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// The ring provider, explicitly: the workspace compiles only ring, and building configs from
/// an explicit provider never depends on a process-wide default being installed.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Everything a process needs for mTLS: its reloadable leaf and the CA roots. Build it once
/// at startup from the flags and derive server and client configs from it.
#[derive(Debug, Clone)]
pub struct TlsContext {
    files: TlsFiles,
    roots: Arc<RootCertStore>,
    reloader: Arc<CertReloader>,
    provider: Arc<CryptoProvider>,
    crl: Option<Arc<CrlVerifiers>>,
}

impl TlsContext {
    /// Loads the CA bundle and the leaf pair. Any problem here is a startup error. The CA is
    /// read once (rotate it by overlapping bundles and restarts); the leaf is reloaded when
    /// its files change.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        Self::load_with_check_interval(files, crate::reload::DEFAULT_RELOAD_CHECK_INTERVAL)
    }

    /// As [`TlsContext::load`] with a custom minimum interval between file checks.
    pub fn load_with_check_interval(
        files: &TlsFiles,
        check_interval: Duration,
    ) -> Result<Self, TlsError> {
        let provider = crypto_provider();
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&files.ca)? {
            roots.add(cert).map_err(|e| TlsError::BadCa {
                path: files.ca.clone(),
                reason: e.to_string(),
            })?;
        }
        let reloader = CertReloader::load(&files.cert, &files.key, Arc::clone(&provider))?
            .with_check_interval(check_interval);
        let roots = Arc::new(roots);
        let crl = files
            .crl
            .as_deref()
            .map(|path| {
                CrlVerifiers::load(
                    path,
                    Arc::clone(&roots),
                    Arc::clone(&provider),
                    check_interval,
                )
            })
            .transpose()?;
        Ok(Self {
            files: files.clone(),
            roots,
            reloader: Arc::new(reloader),
            provider,
            crl,
        })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    pub fn reloader(&self) -> &Arc<CertReloader> {
        &self.reloader
    }

    pub fn roots(&self) -> &Arc<RootCertStore> {
        &self.roots
    }

    /// The identity carried by this process's own current certificate (e.g. so a shard can
    /// refuse to start with another shard's certificate).
    pub fn own_identity(&self) -> Result<PeerIdentity, IdentityError> {
        PeerIdentity::from_cert_der(&self.reloader.current_leaf_der())
    }

    /// TLS 1.3 only; every client must present a certificate chaining to the CA (rustls
    /// refuses the handshake otherwise); the served leaf follows file changes.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let verifier = match &self.crl {
            Some(crl) => crl.client_verifier(),
            None => WebPkiClientVerifier::builder_with_provider(
                Arc::clone(&self.roots),
                Arc::clone(&self.provider),
            )
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?,
        };
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(self.reloader.clone());
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
        Ok(Arc::new(config))
    }

    /// TLS 1.3 only; servers are verified against the same CA; our current leaf is
    /// presented as the client certificate.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let builder = ClientConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut config = match &self.crl {
            // The webpki verifier with CRLs, re-read when the file changes: not "dangerous"
            // in any sense but rustls's name for a verifier it did not build itself.
            Some(crl) => builder
                .dangerous()
                .with_custom_certificate_verifier(crl.server_verifier())
                .with_client_cert_resolver(self.reloader.clone()),
            None => builder
                .with_root_certificates(Arc::clone(&self.roots))
                .with_client_cert_resolver(self.reloader.clone()),
        };
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }
}
