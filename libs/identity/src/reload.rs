//! The process's own certificate, reloaded from disk when the files change.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::TlsError;

/// How often a handshake may trigger a look at the files by default. Handshake storms (10K
/// operators reconnecting) then cost two small file reads per second, not per connection.
pub const DEFAULT_RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What a check found.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The files are as last seen (or were not looked at because of the check interval).
    Unchanged,
    /// A new certificate/key pair is now served.
    Reloaded,
    /// The files changed but did not load; the previous pair stays in use. A later change
    /// to either file is tried again (e.g. the second half of a cert + key rotation).
    Failed(TlsError),
}

/// The raw bytes of both files as last looked at. Content, not mtime, decides "changed":
/// coarse filesystem timestamps can leave a quick in-place rewrite with the same mtime, and
/// the files are a few KB, read at most once per check interval.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    cert: Vec<u8>,
    key: Vec<u8>,
}

#[derive(Debug)]
struct State {
    served: Option<Seen>,
    failed: Option<Seen>,
    last_check: Option<Instant>,
}

/// Serves the current leaf to rustls on both sides of a connection and swaps it when the
/// files change. Lookups are lock-free (arc-swap); checking the files takes a `try_lock`,
/// so a handshake never waits behind another handshake's reload.
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    state: Mutex<State>,
    check_interval: Duration,
}

impl std::fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("check_interval", &self.check_interval)
            .finish_non_exhaustive()
    }
}

impl CertReloader {
    /// Loads the pair now; failing here is a startup error (there is nothing to fall back on).
    pub fn load(
        cert_path: &Path,
        key_path: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let seen = read_pair(cert_path, key_path)?;
        let key = certified_key(&seen, cert_path, key_path, &provider)?;
        Ok(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: ArcSwap::from_pointee(key),
            state: Mutex::new(State {
                served: Some(seen),
                failed: None,
                last_check: Some(Instant::now()),
            }),
            check_interval: DEFAULT_RELOAD_CHECK_INTERVAL,
        })
    }

    /// Minimum time between two file checks triggered by handshakes (zero: every handshake).
    pub fn with_check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }

    /// The pair currently served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// DER of the current leaf certificate.
    pub fn current_leaf_der(&self) -> Vec<u8> {
        self.current()
            .cert
            .first()
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default()
    }

    /// Looks at the files now, ignoring the check interval, and swaps in a changed pair if
    /// it loads.
    pub fn check_now(&self) -> ReloadOutcome {
        let mut state = self.state.lock();
        self.check_locked(&mut state)
    }

    /// What handshakes call: a cheap check at most once per interval, skipped entirely if
    /// another thread is already checking.
    fn maybe_reload(&self) {
        let Some(mut state) = self.state.try_lock() else {
            return;
        };
        if let Some(last) = state.last_check
            && last.elapsed() < self.check_interval
        {
            return;
        }
        self.check_locked(&mut state);
    }

    fn check_locked(&self, state: &mut State) -> ReloadOutcome {
        state.last_check = Some(Instant::now());
        let now = match read_pair(&self.cert_path, &self.key_path) {
            Ok(s) => s,
            Err(e) => {
                // A missing file mid-rotation (e.g. Kubernetes swapping the ..data symlink)
                // is normal for a moment; keep serving what we have.
                tracing::debug!(error = %e, cert = %self.cert_path.display(), "tls files not readable; keeping current certificate");
                return ReloadOutcome::Unchanged;
            }
        };
        if state.served.as_ref() == Some(&now) || state.failed.as_ref() == Some(&now) {
            return ReloadOutcome::Unchanged;
        }
        match certified_key(&now, &self.cert_path, &self.key_path, &self.provider) {
            Ok(key) => {
                self.current.store(Arc::new(key));
                state.served = Some(now);
                state.failed = None;
                tracing::info!(cert = %self.cert_path.display(), "reloaded tls certificate");
                ReloadOutcome::Reloaded
            }
            Err(e) => {
                state.failed = Some(now);
                tracing::warn!(error = %e, cert = %self.cert_path.display(), "changed tls certificate does not load; keeping the previous one");
                ReloadOutcome::Failed(e)
            }
        }
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.maybe_reload();
        Some(self.current())
    }
}

impl ResolvesClientCert for CertReloader {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.maybe_reload();
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<Seen, TlsError> {
    Ok(Seen {
        cert: read(cert)?,
        key: read(key)?,
    })
}

/// Parses a PEM chain and key and checks that they belong together (a rotation caught
/// between writing the new cert and the new key must not serve a mismatched pair).
fn certified_key(
    seen: &Seen,
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = parse_certs(&seen.cert, cert_path)?;
    let key = PrivateKeyDer::from_pem_slice(&seen.key).map_err(|e| TlsError::BadPem {
        path: key_path.to_path_buf(),
        reason: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::KeyPair {
        cert: cert_path.to_path_buf(),
        key: key_path.to_path_buf(),
        reason: e.to_string(),
    })
}

pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(&read(path)?, path)
}

fn parse_certs(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::BadPem {
            path: path.to_path_buf(),
            reason: "no certificate found".to_owned(),
        });
    }
    Ok(certs)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}
