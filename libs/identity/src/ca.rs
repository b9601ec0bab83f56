//! A certificate authority for bigfleet identities: production code, not a test helper.
//!
//! [`CertificateAuthority`] creates a self-signed ECDSA P-256 CA or loads one from PEM, and
//! issues leaves carrying exactly one `bigfleet://` URI SAN (the identity services authorise
//! on), optional DNS/IP SANs for the server side, and both serverAuth and clientAuth usages
//! (every bigfleet process serves and dials with one certificate). Every leaf gets a fresh
//! P-256 key. [`IssuedLeaf::write_bundle`] writes the `--tls-cert --tls-key --tls-ca` triple
//! into a directory, the key readable by its owner only.
//!
//! Users: `bigfleet up --tls` (a CA per run) and `bigfleet pki` (the chart's CA, ADR-0110).

use std::fmt;
use std::fs;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{IDENTITY_SCHEME, PeerIdentity, TlsFiles};

/// Default lifetime of a CA created here (ten years): rotating a CA means restarting every
/// process (they read `ca.crt` once), so it is long-lived on purpose.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default lifetime of a leaf (one year). Leaves reload live, so they can be short-lived
/// wherever something re-issues them.
pub const DEFAULT_LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// `notBefore` is back-dated by this much so a peer whose clock is slightly behind the
/// issuer's accepts a certificate issued a moment ago.
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Validities outside this range are refused (the upper bound keeps dates far from year 9999).
const MIN_VALIDITY: Duration = Duration::from_secs(60);
const MAX_VALIDITY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Why a CA could not be created or loaded, or a leaf not issued, written or verified.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("bad identity {uri:?}: {reason}")]
    BadIdentity { uri: String, reason: &'static str },
    #[error("bad subject alternative name {name:?}: {reason}")]
    BadName { name: String, reason: String },
    #[error("validity {0:?} is outside 1 minute ..= 100 years")]
    BadValidity(Duration),
    #[error("ca certificate: {0}")]
    BadCaCert(String),
    #[error("ca private key: {0}")]
    BadCaKey(String),
    #[error("the ca private key does not belong to the ca certificate")]
    KeyMismatch,
    #[error("certificate: {0}")]
    BadCert(String),
    #[error("signing: {0}")]
    Sign(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate does not verify against the ca: {0}")]
    Verify(String),
}

/// A CA that can issue bigfleet leaves. Holds the CA private key in memory.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    not_after: SystemTime,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA named `common_name` with a fresh ECDSA P-256 key, valid from now
    /// for `validity`. It may sign leaves only (path length 0).
    pub fn create(common_name: &str, validity: Duration) -> Result<Self, CaError> {
        let (not_before, not_after) = validity_window(validity)?;
        let mut params = ca_params(common_name, BasicConstraints::Constrained(0));
        set_validity(&mut params, not_before, not_after);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            not_after: whole_seconds(not_after),
        })
    }

    /// A CA from its PEM certificate (the first one in `cert_pem`) and PKCS#8 PEM private
    /// key. Refuses a certificate that is not a CA and a key that is not the certificate's.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CaError::BadCaCert(e.to_string()))?;
        let (_, x509) =
            X509Certificate::from_der(&der).map_err(|e| CaError::BadCaCert(e.to_string()))?;
        if !x509.is_ca() {
            return Err(CaError::BadCaCert(
                "not a CA certificate (basicConstraints CA:FALSE or missing)".to_owned(),
            ));
        }
        let not_after = unix_time(x509.validity().not_after.timestamp());
        let key = KeyPair::from_pem(key_pem).map_err(|e| CaError::BadCaKey(e.to_string()))?;
        if !same_public_key(&x509, &key) {
            return Err(CaError::KeyMismatch);
        }
        let issuer =
            Issuer::from_ca_cert_der(&der, key).map_err(|e| CaError::BadCaCert(e.to_string()))?;
        // Re-encode so `cert_pem` is exactly the one certificate, whatever surrounded it.
        let cert_pem = pem_encode("CERTIFICATE", &der);
        Ok(Self {
            issuer,
            cert_pem,
            cert_der: der.into_owned(),
            not_after,
        })
    }

    /// [`CertificateAuthority::from_pem`] from two files.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, CaError> {
        let read = |path: &Path| {
            fs::read_to_string(path).map_err(|source| CaError::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        Self::from_pem(&read(cert)?, &read(key)?)
    }

    /// The CA certificate, PEM (what goes into every `ca.crt`).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA private key, PKCS#8 PEM: store it where only the issuer can read it.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Issues a leaf for `request` with a fresh ECDSA P-256 key. The leaf never outlives
    /// the CA: its `notAfter` is capped at the CA's.
    pub fn issue(&self, request: &LeafRequest) -> Result<IssuedLeaf, CaError> {
        let (not_before, mut not_after) = validity_window(request.validity)?;
        not_after = not_after.min(self.not_after);
        let mut params = leaf_params(&request.uri);
        set_validity(&mut params, not_before, not_after);
        let uri = request
            .uri
            .as_str()
            .try_into()
            .map_err(|_| CaError::BadIdentity {
                uri: request.uri.clone(),
                reason: "not an IA5 string",
            })?;
        let mut sans = vec![SanType::URI(uri)];
        for name in &request.dns_names {
            let ia5 = name
                .as_str()
                .try_into()
                .map_err(|e: rcgen::Error| CaError::BadName {
                    name: name.clone(),
                    reason: e.to_string(),
                })?;
            sans.push(SanType::DnsName(ia5));
        }
        sans.extend(request.ips.iter().copied().map(SanType::IpAddress));
        params.subject_alt_names = sans;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedLeaf {
            identity: request.uri.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            not_after: whole_seconds(not_after),
        })
    }

    /// Checks that `leaf_der` chains to this CA and is currently valid for client
    /// authentication — the check every bigfleet server applies to its peers.
    pub fn verify(&self, leaf_der: &[u8]) -> Result<(), CaError> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.cert_der.clone())
            .map_err(|e| CaError::Verify(e.to_string()))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            crate::crypto_provider(),
        )
        .build()
        .map_err(|e| CaError::Verify(e.to_string()))?;
        verifier
            .verify_client_cert(&CertificateDer::from(leaf_der), &[], UnixTime::now())
            .map(|_| ())
            .map_err(|e| CaError::Verify(e.to_string()))
    }

    /// A PEM certificate revocation list signed by this CA naming the given leaves (DER),
    /// valid from now for `valid_for`, with sequence number `crl_number` (each new list for
    /// this CA must use a higher one). Serve it to every process with `--tls-crl`.
    pub fn revocation_list(
        &self,
        revoked_leaves: &[&[u8]],
        crl_number: u64,
        valid_for: Duration,
    ) -> Result<String, CaError> {
        let now = SystemTime::now();
        let at = |t: SystemTime| {
            rcgen::date_time_ymd(1970, 1, 1) + t.duration_since(UNIX_EPOCH).unwrap_or_default()
        };
        let mut revoked_certs = Vec::with_capacity(revoked_leaves.len());
        for der in revoked_leaves {
            let (_, x509) =
                X509Certificate::from_der(der).map_err(|e| CaError::BadCert(e.to_string()))?;
            revoked_certs.push(rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from_slice(x509.raw_serial()),
                revocation_time: at(now),
                reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            });
        }
        let params = rcgen::CertificateRevocationListParams {
            this_update: at(now - BACKDATE),
            next_update: at(now + valid_for.max(MIN_VALIDITY)),
            crl_number: rcgen::SerialNumber::from(crl_number),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.issuer)?.pem()?)
    }

    /// Writes the CA certificate (never the key) to `dir/ca.crt` and returns the path.
    pub fn write_ca(&self, dir: &Path) -> Result<PathBuf, CaError> {
        let path = dir.join("ca.crt");
        write_file(&path, self.cert_pem.as_bytes(), 0o644)?;
        Ok(path)
    }

    /// Issues a leaf for `request` and writes it with this CA into `dir` (see
    /// [`IssuedLeaf::write_bundle`]).
    pub fn issue_bundle(
        &self,
        request: &LeafRequest,
        dir: &Path,
        stem: &str,
    ) -> Result<TlsFiles, CaError> {
        self.issue(request)?
            .write_bundle(dir, stem, self.cert_pem())
    }
}

/// What to put into a leaf: its one identity URI SAN, extra DNS/IP SANs, and its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafRequest {
    uri: String,
    dns_names: Vec<String>,
    ips: Vec<IpAddr>,
    validity: Duration,
}

impl LeafRequest {
    /// A leaf for `identity`, written with or without the scheme (`shard/s1` or
    /// `bigfleet://shard/s1`). Only the form is checked here — one to three non-empty
    /// `/`-separated segments of printable ASCII without `?`, `#`, `%` — so roles added
    /// to [`PeerIdentity`] later need no change in the CA; services decide what they accept.
    pub fn new(identity: &str) -> Result<Self, CaError> {
        Ok(Self {
            uri: identity_uri(identity)?,
            dns_names: Vec::new(),
            ips: Vec::new(),
            validity: DEFAULT_LEAF_VALIDITY,
        })
    }

    /// A leaf for a parsed identity.
    pub fn for_peer(identity: &PeerIdentity) -> Self {
        Self {
            uri: identity.to_string(),
            dns_names: Vec::new(),
            ips: Vec::new(),
            validity: DEFAULT_LEAF_VALIDITY,
        }
    }

    pub fn with_dns_name(mut self, name: impl Into<String>) -> Self {
        self.dns_names.push(name.into());
        self
    }

    pub fn with_ip(mut self, ip: IpAddr) -> Self {
        self.ips.push(ip);
        self
    }

    /// Adds `localhost`, `127.0.0.1` and `::1` (local meshes and tests).
    pub fn with_loopback(self) -> Self {
        self.with_dns_name("localhost")
            .with_ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .with_ip(IpAddr::V6(Ipv6Addr::LOCALHOST))
    }

    pub fn with_validity(mut self, validity: Duration) -> Self {
        self.validity = validity;
        self
    }

    /// The identity URI SAN, e.g. `bigfleet://shard/s1`.
    pub fn identity(&self) -> &str {
        &self.uri
    }

    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    pub fn ips(&self) -> &[IpAddr] {
        &self.ips
    }

    pub fn validity(&self) -> Duration {
        self.validity
    }
}

/// A freshly issued leaf and its private key.
#[derive(Clone)]
pub struct IssuedLeaf {
    /// The identity URI SAN.
    pub identity: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
    pub not_after: SystemTime,
}

impl fmt::Debug for IssuedLeaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedLeaf")
            .field("identity", &self.identity)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl IssuedLeaf {
    /// Writes `dir/<stem>.crt` (0644), `dir/<stem>.key` (0600) and `dir/ca.crt` (0644) —
    /// each through a temporary file renamed into place, so a reader (or a certificate
    /// reloader) never sees half a file and the key is never readable by others, not
    /// even briefly. `dir` must exist.
    pub fn write_bundle(&self, dir: &Path, stem: &str, ca_pem: &str) -> Result<TlsFiles, CaError> {
        let files = TlsFiles::new(
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
            dir.join("ca.crt"),
        );
        write_file(&files.ca, ca_pem.as_bytes(), 0o644)?;
        write_file(&files.key, self.key_pem.as_bytes(), 0o600)?;
        write_file(&files.cert, self.cert_pem.as_bytes(), 0o644)?;
        Ok(files)
    }
}

/// What a certificate says about itself (no verification: see
/// [`CertificateAuthority::verify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Every `bigfleet://` URI SAN (a usable leaf has exactly one).
    pub identity_uris: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub is_ca: bool,
}

impl CertInfo {
    pub fn from_der(der: &[u8]) -> Result<Self, CaError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| CaError::BadCert(e.to_string()))?;
        let mut info = CertInfo {
            identity_uris: Vec::new(),
            dns_names: Vec::new(),
            ips: Vec::new(),
            not_before: unix_time(cert.validity().not_before.timestamp()),
            not_after: unix_time(cert.validity().not_after.timestamp()),
            is_ca: cert.is_ca(),
        };
        let san = cert
            .subject_alternative_name()
            .map_err(|e| CaError::BadCert(e.to_string()))?;
        for name in san.iter().flat_map(|ext| ext.value.general_names.iter()) {
            match name {
                GeneralName::URI(uri) if has_scheme(uri) => {
                    info.identity_uris.push(uri.to_string())
                }
                GeneralName::DNSName(dns) => info.dns_names.push(dns.to_string()),
                GeneralName::IPAddress(bytes) => {
                    if let Ok(v4) = <[u8; 4]>::try_from(*bytes) {
                        info.ips.push(IpAddr::from(v4));
                    } else if let Ok(v6) = <[u8; 16]>::try_from(*bytes) {
                        info.ips.push(IpAddr::from(v6));
                    }
                }
                _ => {}
            }
        }
        Ok(info)
    }

    /// The first certificate of a PEM text.
    pub fn from_pem(pem: &str) -> Result<Self, CaError> {
        let der = CertificateDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| CaError::BadCert(e.to_string()))?;
        Self::from_der(&der)
    }
}

/// The profile of a bigfleet CA certificate named `common_name`: it signs certificates and
/// CRLs; `constraints` bounds the chain below it. Callers add the validity.
pub fn ca_params(common_name: &str, constraints: BasicConstraints) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name_dn(common_name);
    params.is_ca = IsCa::Ca(constraints);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// The profile of every bigfleet leaf certificate named `common_name`: explicitly not a CA,
/// with both ServerAuth and ClientAuth because a process uses one certificate for its server
/// and its client edges. Callers add the SANs and the validity.
pub fn leaf_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name_dn(common_name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params
}

/// Whether the PKCS#8 PEM private key `key_pem` belongs to the certificate `cert_der`
/// (false when either does not parse).
pub fn key_matches_cert(cert_der: &[u8], key_pem: &str) -> bool {
    match (
        X509Certificate::from_der(cert_der),
        KeyPair::from_pem(key_pem),
    ) {
        (Ok((_, cert)), Ok(key)) => same_public_key(&cert, &key),
        _ => false,
    }
}

fn same_public_key(cert: &X509Certificate<'_>, key: &KeyPair) -> bool {
    key.der_bytes() == &*cert.public_key().subject_public_key.data
}

/// A file-name-safe stem for a role, as the test, load and deployment tooling
/// names bundles: `bigfleet://shard/s1/execute` ⇒ `shard-s1-execute`.
pub fn role_file_stem(role: &str) -> String {
    role.strip_prefix("bigfleet://")
        .unwrap_or(role)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `identity` as a `bigfleet://` URI (scheme added when missing, lower-cased when present).
fn identity_uri(identity: &str) -> Result<String, CaError> {
    let bad = |reason| CaError::BadIdentity {
        uri: identity.to_owned(),
        reason,
    };
    let path = if has_scheme(identity) {
        &identity[IDENTITY_SCHEME.len() + 3..]
    } else if identity.contains("://") {
        return Err(bad("the scheme must be bigfleet://"));
    } else {
        identity
    };
    let segments: Vec<&str> = path.split('/').collect();
    if path.is_empty() || segments.len() > 3 {
        return Err(bad("expected one to three /-separated segments"));
    }
    for s in &segments {
        if s.is_empty() {
            return Err(bad("empty segment"));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'?' | b'#' | b'%'))
        {
            return Err(bad(
                "segments are printable ASCII without spaces, '?', '#' or '%'",
            ));
        }
    }
    Ok(format!("{IDENTITY_SCHEME}://{path}"))
}

fn has_scheme(uri: &str) -> bool {
    let n = IDENTITY_SCHEME.len();
    matches!(
        (uri.get(..n), uri.get(n..n + 3)),
        (Some(scheme), Some("://")) if scheme.eq_ignore_ascii_case(IDENTITY_SCHEME)
    )
}

fn validity_window(validity: Duration) -> Result<(SystemTime, SystemTime), CaError> {
    if !(MIN_VALIDITY..=MAX_VALIDITY).contains(&validity) {
        return Err(CaError::BadValidity(validity));
    }
    let now = SystemTime::now();
    Ok((now - BACKDATE, now + validity))
}

/// X.509 times have whole seconds; keep reported times equal to what is encoded.
fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// rcgen takes `time::OffsetDateTime`; offsets from the epoch keep the `time` crate out of
/// our dependency list. Callers pass times after 1970 (see `validity_window`).
fn set_validity(params: &mut CertificateParams, not_before: SystemTime, not_after: SystemTime) {
    let since_epoch = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default();
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since_epoch(not_before);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + since_epoch(not_after);
}

fn unix_time(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

fn common_name_dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len() * 4 / 3 + 4);
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ascii"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Writes `content` to `path` with `mode` via a temporary file in the same directory that
/// is created with that mode and then renamed over `path`.
fn write_file(path: &Path, content: &[u8], mode: u32) -> Result<(), CaError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| CaError::Io { path: p, source }
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    // The umask may have narrowed `mode`; set it exactly (it never widens the key's 0600).
    let result = (|| {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(content)?;
        file.sync_all()
    })();
    drop(file);
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(CaError::Io { path: tmp, source });
    }
    fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_file_stems_are_file_name_safe() {
        assert_eq!(
            role_file_stem("bigfleet://shard/s1/execute"),
            "shard-s1-execute"
        );
        assert_eq!(role_file_stem("cluster/a.b"), "cluster-a-b");
        assert_eq!(role_file_stem("cluster/a b_c"), "cluster-a-b_c");
    }
    use crate::{IdentityError, TlsContext};
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::ServerName;
    use std::os::unix::fs::PermissionsExt;

    fn ca() -> CertificateAuthority {
        CertificateAuthority::create("test ca", DEFAULT_CA_VALIDITY).unwrap()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn leaves_parse_back_to_their_identity() {
        let ca = ca();
        for identity in [
            PeerIdentity::Cluster("c-1".into()),
            PeerIdentity::Shard("bf-shard-0".into()),
            PeerIdentity::ShardExecute("bf-shard-0".into()),
            PeerIdentity::Admin,
            PeerIdentity::Readonly,
        ] {
            let leaf = ca.issue(&LeafRequest::for_peer(&identity)).unwrap();
            assert_eq!(
                PeerIdentity::from_cert_der(&leaf.cert_der).unwrap(),
                identity
            );
            assert_eq!(leaf.identity, identity.to_string());
            // The same identity written as text, with or without the scheme.
            let text = identity.to_string();
            let bare = text.strip_prefix("bigfleet://").unwrap();
            for form in [text.as_str(), bare] {
                let leaf = ca.issue(&LeafRequest::new(form).unwrap()).unwrap();
                assert_eq!(
                    PeerIdentity::from_cert_der(&leaf.cert_der).unwrap(),
                    identity
                );
            }
        }
    }

    #[test]
    fn coordinator_leaves_carry_exactly_their_uri() {
        // Role-agnostic issuance: coordinator replicas get `coordinator/<id>` whether or not
        // this build's PeerIdentity already knows the role.
        let leaf = ca()
            .issue(&LeafRequest::new("coordinator/bf-coordinator-0").unwrap())
            .unwrap();
        let info = CertInfo::from_der(&leaf.cert_der).unwrap();
        assert_eq!(
            info.identity_uris,
            vec!["bigfleet://coordinator/bf-coordinator-0".to_owned()]
        );
        match PeerIdentity::from_cert_der(&leaf.cert_der) {
            Ok(identity) => assert_eq!(identity.to_string(), leaf.identity),
            Err(IdentityError::UnknownIdentity(uri)) => assert_eq!(uri, leaf.identity),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn leaves_have_both_usages_their_names_and_the_requested_lifetime() {
        let ca = ca();
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let validity = Duration::from_secs(7 * 24 * 3600);
        let leaf = ca
            .issue(
                &LeafRequest::new("shard/s1")
                    .unwrap()
                    .with_dns_name("s1.bf-shard-headless.ns.svc")
                    .with_ip(ip)
                    .with_validity(validity),
            )
            .unwrap();
        let info = CertInfo::from_der(&leaf.cert_der).unwrap();
        assert_eq!(info.identity_uris, vec!["bigfleet://shard/s1".to_owned()]);
        assert_eq!(
            info.dns_names,
            vec!["s1.bf-shard-headless.ns.svc".to_owned()]
        );
        assert_eq!(info.ips, vec![ip]);
        assert!(!info.is_ca);
        assert_eq!(info.not_after, leaf.not_after);
        let lifetime = info.not_after.duration_since(SystemTime::now()).unwrap();
        assert!(lifetime <= validity && lifetime > validity - Duration::from_secs(60));
        assert!(info.not_before < SystemTime::now());

        let (_, x509) = X509Certificate::from_der(&leaf.cert_der).unwrap();
        let eku = x509.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        let ca_info = CertInfo::from_der(ca.cert_der()).unwrap();
        assert!(ca_info.is_ca && ca_info.identity_uris.is_empty());

        // A leaf never outlives its CA.
        let short = CertificateAuthority::create("short", Duration::from_secs(3600)).unwrap();
        let capped = short
            .issue(
                &LeafRequest::new("admin")
                    .unwrap()
                    .with_validity(DEFAULT_LEAF_VALIDITY),
            )
            .unwrap();
        assert_eq!(capped.not_after, short.not_after());
    }

    #[test]
    fn every_leaf_gets_a_fresh_key() {
        let ca = ca();
        let request = LeafRequest::new("admin").unwrap();
        let (a, b) = (ca.issue(&request).unwrap(), ca.issue(&request).unwrap());
        assert_ne!(a.key_pem, b.key_pem);
        assert_ne!(a.cert_der, b.cert_der);
        assert!(key_matches_cert(&a.cert_der, &a.key_pem));
        assert!(!key_matches_cert(&a.cert_der, &b.key_pem));
        assert!(!key_matches_cert(&a.cert_der, "garbage"));
        assert!(key_matches_cert(ca.cert_der(), &ca.key_pem()));
    }

    #[test]
    fn malformed_identities_and_validities_are_refused() {
        for bad in [
            "",
            "bigfleet://",
            "shard//x",
            "shard/x/",
            "a/b/c/d",
            "cluster/a b",
            "cluster/a%2F",
            "cluster/a?b",
            "spiffe://cluster/a",
            "cluster/é",
        ] {
            assert!(
                matches!(LeafRequest::new(bad), Err(CaError::BadIdentity { .. })),
                "{bad:?} accepted"
            );
        }
        assert_eq!(
            LeafRequest::new("BIGFLEET://admin").unwrap().identity(),
            "bigfleet://admin"
        );
        let ca = ca();
        for validity in [Duration::ZERO, Duration::from_secs(200 * 365 * 24 * 3600)] {
            let request = LeafRequest::new("admin").unwrap().with_validity(validity);
            assert!(matches!(ca.issue(&request), Err(CaError::BadValidity(_))));
            assert!(matches!(
                CertificateAuthority::create("x", validity),
                Err(CaError::BadValidity(_))
            ));
        }
        let with_bad_dns = LeafRequest::new("admin")
            .unwrap()
            .with_dns_name("bad name é");
        assert!(matches!(
            ca.issue(&with_bad_dns),
            Err(CaError::BadName { .. })
        ));
    }

    #[test]
    fn bundles_are_written_with_a_private_key_file() {
        let ca = ca();
        let dir = tempfile::tempdir().unwrap();
        let request = LeafRequest::new("shard/s1/execute")
            .unwrap()
            .with_loopback();
        let files = ca.issue_bundle(&request, dir.path(), "execute").unwrap();
        assert_eq!(files.cert, dir.path().join("execute.crt"));
        assert_eq!(files.key, dir.path().join("execute.key"));
        assert_eq!(files.ca, dir.path().join("ca.crt"));
        assert_eq!(mode(&files.key), 0o600);
        assert_eq!(mode(&files.cert), 0o644);
        assert_eq!(mode(&files.ca), 0o644);
        assert_eq!(fs::read_to_string(&files.ca).unwrap(), ca.cert_pem());
        assert!(
            fs::read_to_string(&files.key)
                .unwrap()
                .contains("PRIVATE KEY")
        );

        // Rewriting replaces the files (a key left 0644 by someone is narrowed again) and
        // leaves no temporary files behind.
        fs::set_permissions(&files.key, fs::Permissions::from_mode(0o644)).unwrap();
        let again = ca.issue_bundle(&request, dir.path(), "execute").unwrap();
        assert_eq!(mode(&again.key), 0o600);
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");

        // The bundle is what TlsContext loads, and it reports the leaf's identity.
        let ctx = TlsContext::load(&again).unwrap();
        assert_eq!(
            ctx.own_identity().unwrap(),
            PeerIdentity::ShardExecute("s1".into())
        );
        let written = ca.write_ca(dir.path()).unwrap();
        assert_eq!(written, again.ca);
    }

    #[test]
    fn a_loaded_ca_issues_leaves_that_verify_against_the_original() {
        let original = ca();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        fs::write(&cert, original.cert_pem()).unwrap();
        fs::write(&key, original.key_pem()).unwrap();
        let loaded = CertificateAuthority::load(&cert, &key).unwrap();
        assert_eq!(loaded.cert_der(), original.cert_der());
        assert_eq!(loaded.cert_pem(), original.cert_pem());
        assert_eq!(loaded.not_after(), original.not_after());

        let host = "bf-coordinator.ns.svc";
        let leaf = loaded
            .issue(
                &LeafRequest::new("coordinator/bf-coordinator-1")
                    .unwrap()
                    .with_dns_name(host),
            )
            .unwrap();
        // Verified with rustls' own WebPKI verifiers, rooted in the original certificate
        // only: as a server (by DNS name) and as a client.
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(original.cert_der().to_vec()))
            .unwrap();
        let roots = Arc::new(roots);
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::clone(&roots),
            crate::crypto_provider(),
        )
        .build()
        .unwrap();
        let end_entity = CertificateDer::from(leaf.cert_der.clone());
        server_verifier
            .verify_server_cert(
                &end_entity,
                &[],
                &ServerName::try_from(host).unwrap(),
                &[],
                UnixTime::now(),
            )
            .unwrap();
        assert!(
            server_verifier
                .verify_server_cert(
                    &end_entity,
                    &[],
                    &ServerName::try_from("other.ns.svc").unwrap(),
                    &[],
                    UnixTime::now(),
                )
                .is_err()
        );
        original.verify(&leaf.cert_der).unwrap();

        // A leaf from another CA does not verify.
        let stranger = ca().issue(&LeafRequest::new("admin").unwrap()).unwrap();
        assert!(matches!(
            original.verify(&stranger.cert_der),
            Err(CaError::Verify(_))
        ));
    }

    #[test]
    fn loading_refuses_a_leaf_a_foreign_key_and_garbage() {
        let a = ca();
        let b = ca();
        assert!(matches!(
            CertificateAuthority::from_pem(a.cert_pem(), &b.key_pem()),
            Err(CaError::KeyMismatch)
        ));
        let leaf = a.issue(&LeafRequest::new("admin").unwrap()).unwrap();
        assert!(matches!(
            CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem),
            Err(CaError::BadCaCert(_))
        ));
        assert!(matches!(
            CertificateAuthority::from_pem("not pem", &a.key_pem()),
            Err(CaError::BadCaCert(_))
        ));
        assert!(matches!(
            CertificateAuthority::from_pem(a.cert_pem(), "not pem"),
            Err(CaError::BadCaKey(_))
        ));
        // The first certificate of a bundle is the CA; the PEM is normalised to it alone.
        let bundle = format!("{}{}", a.cert_pem(), b.cert_pem());
        let loaded = CertificateAuthority::from_pem(&bundle, &a.key_pem()).unwrap();
        assert_eq!(loaded.cert_pem(), a.cert_pem());
    }

    #[test]
    fn pem_encoding_round_trips() {
        for len in 0..70usize {
            let der: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let pem = pem_encode("CERTIFICATE", &der);
            let back = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
            assert_eq!(back.as_ref(), der.as_slice(), "len {len}");
            assert!(pem.lines().all(|l| l.len() <= 64));
        }
    }

    /// Full handshake between configs built by TlsContext from CA-issued bundles.
    #[test]
    fn issued_bundles_complete_an_mtls_handshake() {
        let ca = ca();
        let dir = tempfile::tempdir().unwrap();
        let server = ca
            .issue_bundle(
                &LeafRequest::new("coordinator/c-0").unwrap().with_loopback(),
                dir.path(),
                "server",
            )
            .unwrap();
        let client = ca
            .issue_bundle(&LeafRequest::new("admin").unwrap(), dir.path(), "client")
            .unwrap();
        let server_cfg = TlsContext::load(&server).unwrap().server_config().unwrap();
        let client_cfg = TlsContext::load(&client).unwrap().client_config().unwrap();
        let mut s = rustls::ServerConnection::new(server_cfg).unwrap();
        let mut c =
            rustls::ClientConnection::new(client_cfg, ServerName::try_from("localhost").unwrap())
                .unwrap();
        for _ in 0..10 {
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            s.read_tls(&mut buf.as_slice()).unwrap();
            s.process_new_packets().unwrap();
            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            c.read_tls(&mut buf.as_slice()).unwrap();
            c.process_new_packets().unwrap();
        }
        assert!(!c.is_handshaking() && !s.is_handshaking());
        let seen = s.peer_certificates().unwrap()[0].as_ref().to_vec();
        assert_eq!(
            PeerIdentity::from_cert_der(&seen).unwrap(),
            PeerIdentity::Admin
        );
    }

    #[test]
    fn revocation_lists_parse_and_name_the_revoked_serials() {
        let ca = CertificateAuthority::create("crl-test", DEFAULT_CA_VALIDITY).unwrap();
        let a = ca.issue(&LeafRequest::new("cluster/a").unwrap()).unwrap();
        let b = ca.issue(&LeafRequest::new("cluster/b").unwrap()).unwrap();
        let pem = ca
            .revocation_list(&[&a.cert_der], 7, Duration::from_secs(3600))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crl");
        std::fs::write(&path, &pem).unwrap();
        let crls = crate::read_crls(&path).unwrap();
        assert_eq!(crls.len(), 1);
        let (_, crl) =
            x509_parser::revocation_list::CertificateRevocationList::from_der(crls[0].as_ref())
                .unwrap();
        let serials: Vec<_> = crl
            .iter_revoked_certificates()
            .map(|r| r.raw_serial().to_vec())
            .collect();
        let serial = |der: &[u8]| {
            X509Certificate::from_der(der)
                .unwrap()
                .1
                .raw_serial()
                .to_vec()
        };
        assert_eq!(serials, vec![serial(&a.cert_der)]);
        assert!(!serials.contains(&serial(&b.cert_der)));
    }
}
