//! A throwaway certificate authority issuing bigfleet role certificates.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, KeyPair, SanType};

use crate::TestkitError;

pub use bigfleet_identity::ca::role_file_stem;

/// The URI scheme every bigfleet identity SAN uses.
const SCHEME: &str = "bigfleet://";

/// A certificate and its private key, PEM encoded (plus the leaf's DER for parsers).
#[derive(Debug, Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
}

impl IssuedCert {
    /// Writes the pair to `cert` and `key` (the key readable by the owner only).
    pub fn write_to(&self, cert: &Path, key: &Path) -> Result<(), TestkitError> {
        write_file(cert, &self.cert_pem, 0o644)?;
        write_file(key, &self.key_pem, 0o600)
    }
}

/// The three files a process needs for mTLS (`--tls-cert --tls-key --tls-ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// What goes into a leaf certificate. Every leaf gets ServerAuth + ClientAuth EKUs because a
/// bigfleet process uses one certificate for both its server and its client edges.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    pub common_name: String,
    pub uris: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl LeafSpec {
    /// No identity SAN, valid for `localhost`, `127.0.0.1` and `::1`.
    pub fn loopback(common_name: &str) -> Self {
        Self {
            common_name: common_name.to_owned(),
            uris: Vec::new(),
            dns_names: vec!["localhost".to_owned()],
            ips: vec![
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ],
        }
    }

    /// A loopback leaf carrying exactly one identity SAN for `role`, which may be written
    /// with or without the scheme (`cluster/a` or `bigfleet://cluster/a`).
    pub fn role(role: &str) -> Self {
        let uri = role_uri(role);
        Self::loopback(&uri).with_uri(&uri)
    }

    pub fn with_uri(mut self, uri: &str) -> Self {
        self.uris.push(uri.to_owned());
        self
    }

    pub fn with_dns(mut self, name: &str) -> Self {
        self.dns_names.push(name.to_owned());
        self
    }

    pub fn with_ip(mut self, ip: IpAddr) -> Self {
        self.ips.push(ip);
        self
    }

    /// The certificate parameters of this leaf (for a CA that keeps its own key elsewhere,
    /// like the load tester's on-disk CA).
    pub fn params(&self) -> Result<CertificateParams, rcgen::Error> {
        let mut params = bigfleet_identity::ca::leaf_params(&self.common_name);
        let mut sans = Vec::new();
        for uri in &self.uris {
            sans.push(SanType::URI(uri.as_str().try_into()?));
        }
        for dns in &self.dns_names {
            sans.push(SanType::DnsName(dns.as_str().try_into()?));
        }
        sans.extend(self.ips.iter().copied().map(SanType::IpAddress));
        params.subject_alt_names = sans;
        Ok(params)
    }
}

/// The parameters of a self-signed bigfleet CA named `common_name`.
pub fn ca_params(common_name: &str) -> CertificateParams {
    bigfleet_identity::ca::ca_params(common_name, BasicConstraints::Unconstrained)
}

/// A self-signed CA that lives as long as the value (nothing is persisted except the PEM
/// files you ask for).
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA with a fresh ECDSA P-256 key.
    pub fn new(common_name: &str) -> Result<Self, TestkitError> {
        let issuer = CertifiedIssuer::self_signed(ca_params(common_name), KeyPair::generate()?)?;
        Ok(Self { issuer })
    }

    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn ca_der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// Issues a leaf for `spec` with a fresh key.
    pub fn issue(&self, spec: &LeafSpec) -> Result<IssuedCert, TestkitError> {
        let params = spec.params()?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
        })
    }

    /// A loopback leaf for one role (`cluster/a`, `shard/s1`, `shard/s1/execute`, `admin`,
    /// `readonly`; the `bigfleet://` prefix is optional).
    pub fn issue_role(&self, role: &str) -> Result<IssuedCert, TestkitError> {
        self.issue(&LeafSpec::role(role))
    }

    /// Writes the CA certificate to `dir/ca.crt` and returns the path.
    pub fn write_ca(&self, dir: &Path) -> Result<PathBuf, TestkitError> {
        let path = dir.join("ca.crt");
        write_file(&path, &self.ca_pem(), 0o644)?;
        Ok(path)
    }

    /// Writes `cert` as `dir/<stem>.crt` + `dir/<stem>.key` next to `dir/ca.crt`.
    pub fn write_bundle(
        &self,
        dir: &Path,
        stem: &str,
        cert: &IssuedCert,
    ) -> Result<TlsPaths, TestkitError> {
        let paths = TlsPaths {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
            ca: self.write_ca(dir)?,
        };
        cert.write_to(&paths.cert, &paths.key)?;
        Ok(paths)
    }

    /// Issues a role certificate and writes it with the CA into `dir`; file names come from
    /// [`role_file_stem`] (`cluster/a` ⇒ `cluster-a.crt`).
    pub fn write_role_bundle(&self, dir: &Path, role: &str) -> Result<TlsPaths, TestkitError> {
        let cert = self.issue_role(role)?;
        self.write_bundle(dir, &role_file_stem(role), &cert)
    }
}

fn role_uri(role: &str) -> String {
    if role.starts_with(SCHEME) {
        role.to_owned()
    } else {
        format!("{SCHEME}{role}")
    }
}

fn write_file(path: &Path, content: &str, mode: u32) -> Result<(), TestkitError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| TestkitError::Io {
        path: path.to_path_buf(),
        source,
    };
    fs::write(path, content).map_err(io)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::*;

    fn sans(der: &[u8]) -> (Vec<String>, Vec<String>, usize) {
        let (_, cert) = X509Certificate::from_der(der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let mut uris = Vec::new();
        let mut dns = Vec::new();
        let mut ips = 0;
        for n in &san.value.general_names {
            match n {
                GeneralName::URI(u) => uris.push(u.to_string()),
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(_) => ips += 1,
                _ => {}
            }
        }
        (uris, dns, ips)
    }

    #[test]
    fn role_certificates_carry_one_identity_san_and_loopback_names() {
        let ca = TestCa::new("test ca").unwrap();
        let cert = ca.issue_role("cluster/a").unwrap();
        let (uris, dns, ips) = sans(&cert.cert_der);
        assert_eq!(uris, vec!["bigfleet://cluster/a".to_owned()]);
        assert_eq!(dns, vec!["localhost".to_owned()]);
        assert_eq!(ips, 2);

        let (_, parsed) = X509Certificate::from_der(&cert.cert_der).unwrap();
        let eku = parsed.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        assert!(!parsed.is_ca());
        // The production leaf profile: "not a CA" is stated, not just implied.
        let constraints = parsed
            .basic_constraints()
            .unwrap()
            .expect("basicConstraints");
        assert!(!constraints.value.ca);
        let ca_der = ca.ca_der();
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
        assert!(ca_cert.is_ca());
        assert_eq!(parsed.issuer(), ca_cert.subject());
    }

    #[test]
    fn custom_specs_can_have_zero_or_two_identity_sans() {
        let ca = TestCa::new("test ca").unwrap();
        let none = ca.issue(&LeafSpec::loopback("none")).unwrap();
        assert!(sans(&none.cert_der).0.is_empty());
        let two = ca
            .issue(&LeafSpec::role("admin").with_uri("bigfleet://readonly"))
            .unwrap();
        assert_eq!(sans(&two.cert_der).0.len(), 2);
    }

    #[test]
    fn role_bundles_are_written_with_safe_names() {
        let ca = TestCa::new("test ca").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let paths = ca
            .write_role_bundle(dir.path(), "bigfleet://shard/s1/execute")
            .unwrap();
        assert_eq!(paths.cert, dir.path().join("shard-s1-execute.crt"));
        assert_eq!(paths.key, dir.path().join("shard-s1-execute.key"));
        assert_eq!(paths.ca, dir.path().join("ca.crt"));
        assert!(
            fs::read_to_string(&paths.cert)
                .unwrap()
                .contains("BEGIN CERTIFICATE")
        );
        assert!(
            fs::read_to_string(&paths.key)
                .unwrap()
                .contains("PRIVATE KEY")
        );
        assert_eq!(fs::read_to_string(&paths.ca).unwrap(), ca.ca_pem());
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&paths.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn every_issue_uses_a_fresh_key() {
        let ca = TestCa::new("test ca").unwrap();
        let a = ca.issue_role("admin").unwrap();
        let b = ca.issue_role("admin").unwrap();
        assert_ne!(a.key_pem, b.key_pem);
        assert_ne!(a.cert_der, b.cert_der);
    }
}
